"""GRPO / decoupled-PPO loss, pure torch.

Advantages are group-normalised rewards (one group = the samples of one task).  Three
policies meet in the loss, the decoupled-PPO way:

- *behaviour*: the logprobs the generator sampled with, carried by each rollout;
- *proximal*: the learner's policy at the start of the batch (a no-grad forward pass);
- *current*: the policy being optimised, which moves with every minibatch step.

The ratio ``current / proximal`` is clipped as in PPO, so several optimizer steps on one
batch cannot move the policy far; the off-policy correction ``proximal / behaviour`` is
a truncated importance weight.  With one optimizer step per batch the proximal policy is
the current one and the clip is inert by construction; the trainer only computes a
separate proximal pass when it takes more.  An optional KL to a reference policy (the
k3 estimator, always non-negative) and an entropy bonus regularise.  Only tokens with
loss mask 1 count.
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
    #: Weight of the k3 KL estimate to the reference policy; 0 computes no reference pass.
    kl_coef: float = 0.0
    #: Weight of the entropy bonus (subtracted from the loss).
    entropy_coef: float = 0.0


@dataclass(frozen=True, kw_only=True)
class LossStats:
    loss: float
    #: Share of trained tokens whose ratio to the proximal policy left ``1 ± clip_eps``.
    clip_fraction: float
    #: Mean of proximal - current logprob over trained tokens: how far this batch's
    #: optimizer steps have moved the policy.
    approx_kl: float
    #: Mean of behaviour - proximal logprob: how far the samples are off-policy.
    behaviour_kl: float
    is_weight_mean: float
    #: Share of trained tokens whose importance weight was truncated at ``is_cap``.
    is_truncated: float
    #: k3 estimate of KL(current || reference); 0 without a reference.
    reference_kl: float
    #: Mean entropy of the current policy at trained tokens (nats).
    entropy: float
    tokens: int
    #: Norm of the update's gradient before clipping (set by the trainer; a norm above
    #: the clip means the step was scaled down).
    grad_norm: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TokenTerms:
    """Per-token inputs of the loss, all ``[B, L]`` (``entropy`` and ``reference`` optional)."""

    current: torch.Tensor
    proximal: torch.Tensor
    behaviour: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor | None = None
    reference: torch.Tensor | None = None


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
    return target_logprobs(logits[:, :-1], tokens[:, 1:])


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Logprob of ``targets`` ``[B, L]`` under ``logits`` ``[B, L, V]`` (already aligned)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each distribution: ``[B, L]`` from logits ``[B, L, V]``."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return -(logprobs.exp() * logprobs).sum(-1)


def policy_loss(
    terms: TokenTerms, advantages: torch.Tensor, config: LossConfig
) -> tuple[torch.Tensor, LossStats]:
    """Token-mean loss over ``terms.mask`` (``advantages`` ``[B]``) and its statistics."""
    current, proximal, mask = terms.current, terms.proximal.detach(), terms.mask
    ratio = torch.exp(current - proximal)
    weight = torch.exp(proximal - terms.behaviour).clamp(max=config.is_cap)
    adv = advantages.unsqueeze(-1)
    clipped = ratio.clamp(1 - config.clip_eps, 1 + config.clip_eps)
    per_token = -weight * torch.minimum(ratio * adv, clipped * adv)
    kl = _k3(current, terms.reference)
    if kl is not None and config.kl_coef:
        per_token = per_token + config.kl_coef * kl
    if terms.entropy is not None and config.entropy_coef:
        per_token = per_token - config.entropy_coef * terms.entropy
    count = mask.sum().clamp(min=1)
    loss = (per_token * mask).sum() / count

    def mean(values: torch.Tensor | None) -> float:
        return 0.0 if values is None else float((values.detach() * mask).sum() / count)

    with torch.no_grad():
        stats = LossStats(
            loss=float(loss),
            clip_fraction=mean(((ratio - 1).abs() > config.clip_eps).float()),
            approx_kl=mean(proximal - current),
            behaviour_kl=mean(terms.behaviour - proximal),
            is_weight_mean=mean(weight),
            is_truncated=mean((torch.exp(proximal - terms.behaviour) > config.is_cap).float()),
            reference_kl=mean(kl),
            entropy=mean(terms.entropy),
            tokens=int(mask.sum()),
        )
    return loss, stats


def _k3(current: torch.Tensor, reference: torch.Tensor | None) -> torch.Tensor | None:
    """Schulman's k3 estimator of KL(current || reference): unbiased and never negative."""
    if reference is None:
        return None
    log_ratio = reference.detach() - current
    return torch.exp(log_ratio) - log_ratio - 1
