"""Rows of several requests decoded as one batch: left-padded KV, per-row positions.

Every layer's KV is ``[rows, kv_heads, width, head_dim]``; each row's real tokens are
right-aligned (left padding) and ``lengths`` counts each row's real tokens, which is
also the position of the row's next token; the attention mask follows from the lengths.
A decode step appends one column to every row, so rows stay right-aligned; a joining
request is padded to the batch's width (or the batch to its width), and columns that no
row uses any more are cut off when rows leave.

Worker-thread only: the engine touches a batch from its single torch thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

Owner = TypeVar("Owner")


class Batch(Generic[Owner]):
    """The decoding rows; each belongs to an owner (a request) of type ``Owner``.

    An owner's rows join together and keep their order, so they stay consecutive.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._reset()

    def _reset(self) -> None:
        self.cache: DynamicCache | None = None
        #: Columns of the KV (the longest row's length).
        self.width = 0
        self.lengths: list[int] = []
        self.owners: list[Owner] = []
        #: Each row's index among its owner's rows.
        self.rows: list[int] = []

    def __len__(self) -> int:
        return len(self.owners)

    def members(self) -> Iterator[tuple[Owner, int]]:
        return zip(self.owners, self.rows, strict=True)

    def add(self, cache: DynamicCache, owner: Owner, rows: int) -> None:
        """Join ``rows`` rows whose KV (no padding, all one length) is ``cache``."""
        length = cache.get_seq_length()
        if self.cache is None:
            self.cache = cache
        else:
            width = max(self.width, length)
            for mine, theirs in zip(_layers(self.cache), _layers(cache), strict=True):
                mine.keys = torch.cat((_pad(_keys(mine), width), _pad(_keys(theirs), width)))
                mine.values = torch.cat((_pad(_values(mine), width), _pad(_values(theirs), width)))
        self.width = max(self.width, length)
        self.lengths += [length] * rows
        self.owners += [owner] * rows
        self.rows += list(range(rows))

    def keep(self, indices: list[int]) -> None:
        """Only the rows at ``indices`` stay (in that order)."""
        if not indices:
            self._reset()
            return
        assert self.cache is not None
        chosen = torch.tensor(indices, device=self.device)
        self.cache.batch_select_indices(chosen)
        self.lengths = [self.lengths[i] for i in indices]
        self.owners = [self.owners[i] for i in indices]
        self.rows = [self.rows[i] for i in indices]
        self._trim()

    def _trim(self) -> None:
        """Cut the leading columns that are padding in every row."""
        unused = self.width - max(self.lengths)
        if unused <= 0:
            return
        assert self.cache is not None
        for layer in _layers(self.cache):
            layer.keys = _keys(layer)[:, :, unused:]
            layer.values = _values(layer)[:, :, unused:]
        self.width -= unused

    def step(self, last_tokens: list[int]) -> dict[str, torch.Tensor | None]:
        """Model inputs for one new token per row (the rows' last sampled tokens).

        The bookkeeping counts that token at once: the forward pass appends its KV (and
        if it fails, the engine drops the whole batch).
        """
        ids = torch.tensor(last_tokens, device=self.device).unsqueeze(1)
        lengths = torch.tensor(self.lengths, device=self.device)
        # Without padding, no mask: the model takes its plain causal path.
        mask = None
        if min(self.lengths) < self.width:
            columns = torch.arange(self.width + 1, device=self.device)
            mask = columns >= (self.width - lengths).unsqueeze(1)
        self.width += 1
        self.lengths = [n + 1 for n in self.lengths]
        return {"input_ids": ids, "position_ids": lengths.unsqueeze(1), "attention_mask": mask}

    def row_kv(self, row: int, start: int, end: int) -> torch.Tensor:
        """``[layers, 2, kv_heads, end - start, head_dim]``: KV of a row's tokens start..end."""
        assert self.cache is not None
        skip = self.width - self.lengths[row]  # the row's left padding
        columns = slice(skip + start, skip + end)
        return torch.stack(
            [
                torch.stack((_keys(layer)[row, :, columns], _values(layer)[row, :, columns]))
                for layer in self.cache.layers
            ]
        )

    def spans(self) -> Iterator[tuple[Owner, slice]]:
        """Each owner's run of consecutive rows."""
        start = 0
        for i in range(1, len(self) + 1):
            if i == len(self) or self.owners[i] is not self.owners[start]:
                yield self.owners[start], slice(start, i)
                start = i


def full_attention(cache: DynamicCache) -> bool:
    """Whether every layer keeps one K/V per token (no sliding window, no recurrence)."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    layers = list(cache.layers)
    assert all(isinstance(layer, DynamicLayer) for layer in layers), "full attention only"
    return layers  # type: ignore[return-value]


def _keys(layer: object) -> torch.Tensor:
    assert isinstance(layer, DynamicLayer) and layer.keys is not None
    return layer.keys


def _values(layer: object) -> torch.Tensor:
    assert isinstance(layer, DynamicLayer) and layer.values is not None
    return layer.values


def _pad(kv: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad KV's sequence axis with zeros to ``width`` columns."""
    missing = width - kv.shape[2]
    if missing <= 0:
        return kv
    shape = list(kv.shape)
    shape[2] = missing
    return torch.cat((kv.new_zeros(shape), kv), dim=2)
