"""The learner's forward pass: log-probabilities and entropy of the trained tokens only.

The output head runs on the positions whose next token is trained, not on every position
of the padded batch.  With a vocabulary of 150k tokens the head's logits are what a step
costs: a multi-turn tool batch is mostly prompt, tool output and padding, and one long
sample padded a micro-batch of 16 to [16, 500, 150k] floats (several GB, most of a
minute on 2 cores) for a few hundred trained tokens.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from services.learner.rows import Rows
from services.model.load import default_dtype


@dataclass(frozen=True)
class Trained:
    """Per-token figures ``[B, L]`` aligned with ``rows.mask``; 0 where it is 0."""

    logprobs: torch.Tensor
    #: Entropy of the policy's distribution at each trained position (nats); None when
    #: not asked for.
    entropy: torch.Tensor | None


def trained_logprobs(model: Any, rows: Rows, part: slice, *, entropy: bool = False) -> Trained:
    """The policy's logprob of each trained token of ``rows[part]``, in float32; computed
    in the device's dtype of the policy (bf16 autocast on a GPU)."""
    mask = rows.mask[part] > 0
    with _compute_precision(rows.tokens.device):
        hidden = model.base_model(
            input_ids=rows.tokens[part], attention_mask=rows.attention[part]
        ).last_hidden_state
        logits: torch.Tensor = model.get_output_embeddings()(hidden[:, rows.first : -1][mask])
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(-1, rows.targets(part)[mask].unsqueeze(-1)).squeeze(-1)
    spread = _spread(chosen, mask)
    if not entropy:
        return Trained(logprobs=spread, entropy=None)
    return Trained(logprobs=spread, entropy=_spread(-(logprobs.exp() * logprobs).sum(-1), mask))


def _spread(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` (one per True of ``mask``) back in ``mask``'s shape, 0 elsewhere; the
    gradient flows to ``values``."""
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(
        mask, values
    )


def _compute_precision(device: torch.device) -> contextlib.AbstractContextManager[object]:
    dtype = default_dtype(device)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
