"""Rows of several requests decoded as one batch: left-padded KV, per-row positions.

Every layer's KV is ``[rows, kv_heads, width, head_dim]``; each row's real tokens are
right-aligned (left padding) and ``lengths`` counts each row's real tokens, which is
also the position of the row's next token; the attention mask follows from the lengths.
A decode step appends one column to every row, so rows stay right-aligned; joining rows
are padded to the batch's width (or the batch to theirs), and columns that no row uses
any more are cut off when rows leave.

Prompts admitted together are prefilled together (:class:`Prefill`): one forward pass
over every prompt's new tokens, each after its own cached prefix.  Few-row products
waste most of what a CPU or GPU can do, so a pass over four prompts of a hundred new
tokens costs well under four passes of one.

Worker-thread only: the engine touches a batch from its single torch thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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

    def join(
        self, cache: DynamicCache, members: Sequence[tuple[Owner, int]], lengths: Sequence[int]
    ) -> None:
        """Join rows whose KV is ``cache`` (left-padded, right-aligned), one per member
        (its owner, its index among the owner's rows), of ``lengths`` real tokens."""
        width = cache.get_seq_length()
        if self.cache is None:
            self.cache = cache
            cache.layers[:] = [RoomyLayer.adopt(layer) for layer in _layers(cache)]
        else:
            both = max(self.width, width)
            for mine, theirs in zip(_layers(self.cache), _layers(cache), strict=True):
                mine.keys = torch.cat((_pad(_keys(mine), both), _pad(_keys(theirs), both)))
                mine.values = torch.cat((_pad(_values(mine), both), _pad(_values(theirs), both)))
        self.width = max(self.width, width)
        self.lengths += lengths
        self.owners += [owner for owner, _ in members]
        self.rows += [row for _, row in members]
        self._trim()

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
        return _row_kv(self.cache, row, slice(skip + start, skip + end))

    def spans(self) -> Iterator[tuple[Owner, slice]]:
        """Each owner's run of consecutive rows."""
        start = 0
        for i in range(1, len(self) + 1):
            if i == len(self) or self.owners[i] is not self.owners[start]:
                yield self.owners[start], slice(start, i)
                start = i


class RoomyLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A DynamicLayer that appends in place: its keys and values are views of buffers
    with room for ``ROOM`` more columns, so that a decode step writes its column where
    DynamicLayer copies the whole KV into a new tensor.  Whatever replaces ``keys`` or
    ``values`` (the batch joining, selecting or trimming rows) is copied into new
    buffers at the next update."""

    #: Columns of room made at a time (a copy of the KV once per ROOM decode steps).
    ROOM = 64

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._views: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def adopt(cls, layer: DynamicLayer) -> DynamicLayer:
        """The same KV in a RoomyLayer; another kind of layer as it is."""
        if type(layer) is not DynamicLayer:
            return layer
        roomy = cls()
        roomy.__dict__.update(layer.__dict__)
        return roomy

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized or self.keys is None or self.values is None:
            return super().update(key_states, value_states, *args, **kwargs)
        used, new = self.keys.shape[-2], key_states.shape[-2]
        if not self._ours() or self._room() < new:
            self._rebuffer(new)
        assert self._buffers is not None
        buf_keys, buf_values = self._buffers
        buf_keys[:, :, used : used + new] = key_states
        buf_values[:, :, used : used + new] = value_states
        self.keys, self.values = buf_keys[:, :, : used + new], buf_values[:, :, : used + new]
        self._views = (self.keys, self.values)
        return self.keys, self.values

    def _ours(self) -> bool:
        """Whether keys and values are still the views this layer made."""
        views = self._views
        return views is not None and views[0] is self.keys and views[1] is self.values

    def _room(self) -> int:
        assert self._buffers is not None and self.keys is not None
        return self._buffers[0].shape[-2] - self.keys.shape[-2]

    def _rebuffer(self, new: int) -> None:
        assert self.keys is not None and self.values is not None
        used = self.keys.shape[-2]
        buffers = []
        for kv in (self.keys, self.values):
            shape = (*kv.shape[:2], used + new + self.ROOM, kv.shape[3])
            buffer = kv.new_empty(shape)
            buffer[:, :, :used] = kv
            buffers.append(buffer)
        self._buffers = (buffers[0], buffers[1])


@dataclass(frozen=True)
class Prefill:
    """One forward pass over several prompts' new tokens, each after its own cached prefix.

    Row i's KV is laid out ``[padding][prefix: cached[i]][gap][new: new[i]]`` over
    ``past + span`` columns, where ``past`` is the longest prefix and ``span`` the most new
    tokens; the gap (``span - new[i]`` columns) holds padding tokens, which the mask hides
    from every real token.  A padding token attends to itself at least, so that no row of
    the attention is empty.  After the pass, :meth:`settle` closes the gaps.
    """

    cache: DynamicCache
    inputs: dict[str, torch.Tensor | None]
    cached: list[int]
    new: list[int]

    @classmethod
    def build(
        cls,
        prefixes: Sequence[DynamicCache],
        suffixes: Sequence[Sequence[int]],
        new_cache: Callable[[], DynamicCache],
        mask_dtype: torch.dtype,
        device: torch.device,
    ) -> Prefill:
        """``prefixes``: each prompt's cached KV (one row, no padding, possibly empty).
        ``mask_dtype``: ``torch.bool`` (True: attend) for SDPA, a float dtype for an
        additive mask (attention implementations that add the mask to the scores)."""
        cached = [prefix.get_seq_length() for prefix in prefixes]
        new = [len(suffix) for suffix in suffixes]
        past, span = max(cached), max(new)
        cache = prefixes[0] if len(prefixes) == 1 else _stack_prefixes(prefixes, past, new_cache)
        ids = torch.tensor([[0] * (span - len(t)) + list(t) for t in suffixes], device=device)
        inputs: dict[str, torch.Tensor | None] = {"input_ids": ids}
        if len(set(cached)) > 1 or len(set(new)) > 1:
            inputs["position_ids"] = _prefill_positions(cached, new, span, device)
            inputs["attention_mask"] = _prefill_mask(cached, new, past, span, mask_dtype, device)
        return cls(cache, inputs, cached, new)

    def settle(self) -> list[int]:
        """Close each row's gap (its prefix moved up against its new tokens) and zero its
        padding; the rows' real lengths.  Call once, after the forward pass."""
        width = self.cache.get_seq_length()
        if len(self.new) == 1:  # nothing to close (and a sliding layer may be narrower)
            return [width]
        past = width - max(self.new)
        for row, (cached, new) in enumerate(zip(self.cached, self.new, strict=True)):
            start = width - new - cached
            moved = start != past - cached and cached > 0
            for layer in _layers(self.cache):
                for kv in (_keys(layer), _values(layer)):
                    if moved:
                        prefix = kv[row, :, past - cached : past].clone()
                        kv[row, :, start : start + cached] = prefix
                    kv[row, :, :start] = 0
        return [cached + new for cached, new in zip(self.cached, self.new, strict=True)]

    def row_kv(self, row: int) -> torch.Tensor:
        """``[layers, 2, kv_heads, new, head_dim]``: KV of row ``row``'s new tokens."""
        end = self.cache.get_seq_length()
        return _row_kv(self.cache, row, slice(end - self.new[row], end))


def prefill_groups(new: Sequence[int], max_tokens: int, slack: float) -> list[list[int]]:
    """Indices of prompts to prefill together, by their counts of new tokens.

    A group's pass computes ``rows x most new tokens``; a prompt joins (longest first)
    while that stays within ``1 + slack`` of the group's real new tokens and within
    ``max_tokens``.
    """
    groups: list[list[int]] = []
    real = 0
    for index in sorted(range(len(new)), key=lambda i: -new[i]):
        group = groups[-1] if groups else []
        span = new[group[0]] if group else 0
        rows = len(group) + 1
        if group and rows * span <= (1 + slack) * (real + new[index]) and rows * span <= max_tokens:
            group.append(index)
            real += new[index]
        else:
            groups.append([index])
            real = new[index]
    return groups


def _row_kv(cache: DynamicCache, row: int, columns: slice) -> torch.Tensor:
    """``[layers, 2, kv_heads, columns, head_dim]``: one row's KV over ``columns``."""
    return torch.stack(
        [
            torch.stack((_keys(layer)[row, :, columns], _values(layer)[row, :, columns]))
            for layer in cache.layers
        ]
    )


def _stack_prefixes(
    prefixes: Sequence[DynamicCache], past: int, new_cache: Callable[[], DynamicCache]
) -> DynamicCache:
    """The prefixes as the rows of one cache, left-padded to ``past`` columns."""
    cache = new_cache()
    if past == 0:
        return cache
    for index in range(max(len(prefix.layers) for prefix in prefixes)):
        layers = [_layer(prefix, index) for prefix in prefixes]
        like = next(layer for layer in layers if layer is not None)
        keys = torch.cat([_pad(_keys(x) if x else _none(_keys(like)), past) for x in layers])
        values = torch.cat([_pad(_values(x) if x else _none(_values(like)), past) for x in layers])
        cache.update(keys, values, index)
    return cache


def _layer(cache: DynamicCache, index: int) -> DynamicLayer | None:
    """Layer ``index`` of a one-row cache if it holds any token (a cache built without a
    config has no layers until its first update)."""
    if index >= len(cache.layers):
        return None
    layer = cache.layers[index]
    assert isinstance(layer, DynamicLayer), "full attention only"
    return layer if _filled(layer) else None


def _filled(layer: DynamicLayer) -> bool:
    return layer.keys is not None and layer.keys.numel() > 0


def _none(like: torch.Tensor) -> torch.Tensor:
    """No tokens, in the shape of ``like`` (one row)."""
    return like.new_zeros((1, like.shape[1], 0, like.shape[3]))


def _prefill_positions(
    cached: Sequence[int], new: Sequence[int], span: int, device: torch.device
) -> torch.Tensor:
    """Each new token's position; a padding token takes its row's first new position."""
    rows = []
    for c, n in zip(cached, new, strict=True):
        rows.append([c] * (span - n) + list(range(c, c + n)))
    return torch.tensor(rows, device=device)


def _prefill_mask(
    cached: Sequence[int],
    new: Sequence[int],
    past: int,
    span: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """``[rows, 1, span, past + span]`` mask: a real token sees its row's prefix and its
    row's real tokens up to itself; a padding token also sees itself.  Boolean (True:
    seen), or additive in a float ``dtype`` (0: seen)."""
    columns = torch.arange(past + span, device=device)
    queries = past + torch.arange(span, device=device)
    cached_t = torch.tensor(cached, device=device).view(-1, 1)
    new_t = torch.tensor(new, device=device).view(-1, 1)
    real = ((columns >= past - cached_t) & (columns < past)) | (columns >= past + span - new_t)
    causal = columns.view(1, -1) <= queries.view(-1, 1)
    allowed = (real.unsqueeze(1) & causal) | (columns.view(1, -1) == queries.view(-1, 1))
    if dtype == torch.bool:
        return allowed.unsqueeze(1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min).unsqueeze(1)


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
