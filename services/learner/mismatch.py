"""How far the learner's log-probabilities of the sampled tokens are from the behaviour
log-probabilities the generator carried in the rollout.

For samples the learner's current weights generated, the two must agree up to the
numerics of the engine and the dtype: a gap beyond that means the learner trains on
something other than what was sampled (a re-tokenized turn, shifted positions, a wrong
mask, stale weights in the engine).  Pure torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class Mismatch:
    """Absolute difference of recomputed and behaviour logprobs over the measured tokens.

    ``tokens == 0`` means nothing was measured; ``mean`` and ``max`` are then 0.0, never
    NaN, so a metrics line stays plain numbers.
    """

    mean: float
    max: float
    tokens: int


#: Nothing measured.
NOT_MEASURED = Mismatch(mean=0.0, max=0.0, tokens=0)


def logprob_mismatch(
    recomputed: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor
) -> Mismatch:
    """Mean and max of ``|recomputed - behaviour|`` over the tokens where ``mask`` is 1."""
    if recomputed.shape != behaviour.shape or recomputed.shape != mask.shape:
        raise ValueError(
            f"recomputed {tuple(recomputed.shape)}, behaviour {tuple(behaviour.shape)} and "
            f"mask {tuple(mask.shape)} must have one shape"
        )
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("mask must hold only 0 and 1")
    gaps = (recomputed.detach().float() - behaviour.detach().float()).abs()[mask == 1]
    if not gaps.numel():
        return NOT_MEASURED
    return Mismatch(mean=float(gaps.mean()), max=float(gaps.max()), tokens=int(gaps.numel()))


def merge(parts: Sequence[Mismatch]) -> Mismatch:
    """The measurement over the union of ``parts``' tokens (a token-weighted mean)."""
    tokens = sum(p.tokens for p in parts)
    if not tokens:
        return NOT_MEASURED
    mean = sum(p.mean * p.tokens for p in parts) / tokens
    return Mismatch(mean=mean, max=max(p.max for p in parts if p.tokens), tokens=tokens)
