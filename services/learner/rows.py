"""What the trainer makes of a batch before any forward pass: the rollouts it refuses
(with the reason), and the padded rows of those it trains on."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from protocol.messages import FinishReason, ScoredRollout
from protocol.packed import unpack_f32, unpack_i32, unpack_u8
from services.learner.loss import group_advantages
from services.learner.mismatch import Mismatch, logprob_mismatch
from services.learner.reward_bounds import RewardBounds


@dataclass(frozen=True, kw_only=True)
class Refusal:
    rollout_id: str
    reason: str
    #: ``malformed``, or ``negative_staleness``: sampled by a version newer than the
    #: learner's, which lineage rules out; seen, it is a bug to report, never to train on.
    kind: str = "malformed"


@dataclass(frozen=True, kw_only=True)
class ModelLimits:
    """What a rollout must respect to be trained on by this model."""

    vocab: int
    context: int
    rewards: RewardBounds

    @classmethod
    def of(cls, model: Any, rewards: RewardBounds) -> ModelLimits:
        config = model.config
        vocab, context = int(config.vocab_size), int(config.max_position_embeddings)
        return cls(vocab=vocab, context=context, rewards=rewards)

    def problem(self, item: ScoredRollout) -> Refusal | None:
        reason = self._reason(item)
        return None if reason is None else Refusal(rollout_id=item.id, reason=reason)

    def _reason(self, item: ScoredRollout) -> str | None:
        rollout = item.rollout
        ids = unpack_i32(rollout.tokens)
        completion = len(ids) - rollout.prompt_len
        if rollout.prompt_len < 1 or completion < 1:
            return f"prompt_len {rollout.prompt_len} leaves {completion} completion tokens"
        if len(rollout.logprobs) // 4 != completion or len(rollout.loss_mask) != completion:
            return (
                f"{len(rollout.logprobs) // 4} logprobs and {len(rollout.loss_mask)} mask "
                f"entries for {completion} completion tokens"
            )
        if len(ids) > self.context:
            return f"{len(ids)} tokens exceed the model's context of {self.context}"
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
            return f"token ids outside the vocabulary [0, {self.vocab})"
        logprobs = unpack_f32(rollout.logprobs)
        if not np.isfinite(logprobs).all() or float(logprobs.max()) > 1e-3:
            return "behaviour logprobs are not finite negative numbers"
        return self.rewards.reason(item)


@dataclass(frozen=True, kw_only=True)
class Rows:
    """Right-padded sequences; per-token arrays cover the positions from ``first`` on,
    where ``first`` is the earliest position whose next token is trained (the shortest
    prompt's last token): the prompts before it need no logits, which skips most of the
    vocabulary projection when prompts are long and completions short."""

    tokens: torch.Tensor
    attention: torch.Tensor
    first: int
    behaviour: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    #: ``[B]``: 1 for a row sampled by the learner's current weights, whose logprobs the
    #: mismatch compares; 0 for an older one.
    measured: torch.Tensor
    #: The engines that sampled the measured rows (sorted, comma-separated).
    engines: str
    #: ``[B]``: each row's prompt length, and a number its prompt shares with every row
    #: of the same prompt (the samples of one task): the forward pass runs it once.
    prompt_len: torch.Tensor
    prompt: torch.Tensor

    def select(self, index: torch.Tensor) -> Rows:
        return Rows(
            tokens=self.tokens[index],
            attention=self.attention[index],
            first=self.first,
            behaviour=self.behaviour[index],
            mask=self.mask[index],
            advantages=self.advantages[index],
            measured=self.measured[index],
            engines=self.engines,
            prompt_len=self.prompt_len[index],
            prompt=self.prompt[index],
        )

    def longest_first(self, index: torch.Tensor | None = None) -> torch.Tensor:
        """``index`` (every row by default) with the rows of one prompt together, the
        prompts in order of their longest row and each prompt's rows longest first:
        micro-batches cut from it pad each row only to rows of about its own length, and
        share each prompt among as many rows as they can."""
        index = torch.arange(len(self), device=self.tokens.device) if index is None else index
        lengths = self.attention[index].sum(-1).cpu().numpy()
        prompts = self.prompt[index].cpu().numpy()
        longest = np.zeros(int(prompts.max()) + 1 if len(prompts) else 0, dtype=lengths.dtype)
        np.maximum.at(longest, prompts, lengths)
        # lexsort: the last key is the first compared.
        order = np.lexsort((-lengths, prompts, -longest[prompts]))
        return index[torch.from_numpy(order).to(index.device)]

    def mismatch(self, recomputed: torch.Tensor, rows: slice | None = None) -> Mismatch:
        """``recomputed`` (logprobs of ``rows``, all by default) against the behaviour
        logprobs, over the trained tokens of the measured rows."""
        part = slice(None) if rows is None else rows
        mask = self.mask[part] * self.measured[part].unsqueeze(-1)
        return logprob_mismatch(recomputed, self.behaviour[part], mask)

    def targets(self, rows: slice | torch.Tensor) -> torch.Tensor:
        return self.tokens[rows, self.first + 1 :]

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def build(
    items: list[ScoredRollout], *, held: int | None, skip_zero: bool, device: torch.device
) -> Rows | None:
    """The rows to train on (None: none left); those sampled by version ``held`` (if
    any) are measured.  ``skip_zero``: leave out the samples whose advantage is 0."""
    advantages = group_advantages([i.reward for i in items], [i.rollout.task.id for i in items])
    keep = [row for row in range(len(items)) if not _filtered(items[row])]
    if skip_zero:
        keep = [row for row in keep if advantages[row] != 0]
    if not keep:
        return None
    chosen = [items[row] for row in keep]
    tokens, attention, behaviour, mask = _padded(chosen)
    first = min(i.rollout.prompt_len for i in chosen) - 1
    measured = [held is not None and i.rollout.policy_version == held for i in chosen]
    return Rows(
        tokens=tokens.to(device),
        attention=attention.to(device),
        first=first,
        behaviour=behaviour[:, first:].to(device),
        mask=mask[:, first:].to(device),
        advantages=advantages[keep].to(device),
        measured=torch.tensor(measured, dtype=torch.float32, device=device),
        engines=_engines(item for item, m in zip(chosen, measured, strict=True) if m),
        prompt_len=torch.tensor([i.rollout.prompt_len for i in chosen], device=device),
        prompt=torch.tensor(_prompt_numbers(chosen), device=device),
    )


def _prompt_numbers(chosen: list[ScoredRollout]) -> list[int]:
    """One number per distinct prompt (its token ids, not the task: equal ids are shared)."""
    numbers: dict[bytes, int] = {}
    return [
        numbers.setdefault(i.rollout.tokens[: 4 * i.rollout.prompt_len], len(numbers))
        for i in chosen
    ]


def _padded(
    chosen: list[ScoredRollout],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens and attention ``[B, T]``; behaviour logprobs and loss mask ``[B, T-1]``,
    aligned with the position that predicts each token."""
    length = max(len(i.rollout.tokens) // 4 for i in chosen)
    shape = (len(chosen), length)
    tokens = torch.zeros(shape, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    behaviour = torch.zeros((len(chosen), length - 1))
    mask = torch.zeros((len(chosen), length - 1))
    for row, item in enumerate(chosen):
        ids = torch.from_numpy(unpack_i32(item.rollout.tokens).astype("int64"))
        start = item.rollout.prompt_len - 1
        tokens[row, : len(ids)] = ids
        attention[row, : len(ids)] = 1
        completion = len(ids) - item.rollout.prompt_len
        behaviour[row, start : start + completion] = torch.from_numpy(
            unpack_f32(item.rollout.logprobs).copy()
        )
        mask[row, start : start + completion] = torch.from_numpy(
            unpack_u8(item.rollout.loss_mask).astype("float32")
        )
    return tokens, attention, behaviour, mask


def _filtered(item: ScoredRollout) -> bool:
    """Cut at the token limit in a domain that leaves such samples out of the loss."""
    rollout = item.rollout
    return (
        rollout.finish_reason is FinishReason.LENGTH
        and rollout.task.metadata.get("overlong") == "filter"
    )


def _engines(items: Iterable[ScoredRollout]) -> str:
    return ",".join(sorted({item.rollout.engine or "unknown" for item in items}))
