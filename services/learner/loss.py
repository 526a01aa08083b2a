"""GRPO / decoupled-PPO loss, pure torch.

Advantages are group-normalised rewards (one group = the samples of one task).  The
policy gradient is corrected for staleness the decoupled-PPO way: the proximal policy
is the learner's current weights (detached), the ratio to it is clipped as in PPO, and
the off-policy correction ``proximal / behaviour`` (the behaviour logprobs carried by
each rollout) is a truncated importance weight.  Only tokens with loss mask 1 count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    clip_eps: float = 0.2
    #: Truncation of the importance weight proximal/behaviour (truncated IS).
    is_cap: float = 2.0


@dataclass(frozen=True, kw_only=True)
class LossStats:
    loss: float
    clip_fraction: float
    #: Mean of behaviour - current logprob over trained tokens: how far the policy moved.
    approx_kl: float
    is_weight_mean: float
    tokens: int


def group_advantages(rewards: Sequence[float], groups: Sequence[str]) -> torch.Tensor:
    """``(r - mean(group)) / (std(group) + eps)``; 0 for a group whose rewards are all equal."""
    values = torch.tensor(rewards, dtype=torch.float32)
    out = torch.zeros_like(values)
    for key in set(groups):
        index = torch.tensor([i for i, g in enumerate(groups) if g == key])
        members = values[index]
        if len(members) < 2:
            continue
        std = members.std(unbiased=False)
        if std > 1e-6:
            out[index] = (members - members.mean()) / (std + 1e-6)
    return out


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Logprob of each next token: ``[B, T-1]`` from logits ``[B, T, V]`` and tokens ``[B, T]``."""
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logprobs.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


def policy_loss(
    current: torch.Tensor,
    behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
) -> tuple[torch.Tensor, LossStats]:
    """All of ``[B, L]`` (``advantages`` ``[B]``); returns the loss and its statistics."""
    proximal = current.detach()
    ratio = torch.exp(current - proximal)
    weight = torch.exp(proximal - behaviour).clamp(max=config.is_cap)
    adv = advantages.unsqueeze(-1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - config.clip_eps, 1 + config.clip_eps) * adv
    per_token = -weight * torch.minimum(unclipped, clipped)
    count = mask.sum().clamp(min=1)
    loss = (per_token * mask).sum() / count
    with torch.no_grad():
        moved = ((ratio - 1).abs() > config.clip_eps).float()
        stats = LossStats(
            loss=float(loss),
            clip_fraction=float((moved * mask).sum() / count),
            approx_kl=float(((behaviour - proximal) * mask).sum() / count),
            is_weight_mean=float((weight * mask).sum() / count),
            tokens=int(mask.sum()),
        )
    return loss, stats
