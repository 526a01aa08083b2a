"""The learner's model, optimizer and step, on torch: one call trains on one batch.

Weights are published as Hugging Face directories (safetensors plus the tokenizer and
config of the starting model), so the torch engine and SGLang load them as they are.
A checkpoint (model, optimizer, step, version) is written atomically and resumed exactly.
"""

from __future__ import annotations

import os
import shutil
import statistics
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from protocol.messages import ScoredRollout
from protocol.packed import unpack_f32, unpack_i32, unpack_u8
from services.learner.loss import (
    LossConfig,
    LossStats,
    group_advantages,
    policy_loss,
    token_logprobs,
)
from services.runtime.weights import directory_digest

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch: int = 16
    loss: LossConfig = field(default_factory=LossConfig)
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class StepResult:
    step: int
    samples: int
    reward_mean: float
    reward_by_domain: dict[str, float]
    staleness_mean: float
    loss: LossStats


@dataclass(frozen=True, kw_only=True)
class Exported:
    version: int
    path: Path
    digest: str


@dataclass(frozen=True, kw_only=True)
class _Rows:
    tokens: torch.Tensor
    attention: torch.Tensor
    behaviour: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor


class Trainer:
    def __init__(self, model_dir: Path, out_dir: Path, config: TrainerConfig, device: str = "cpu"):
        from transformers import AutoModelForCausalLM

        torch.manual_seed(config.seed)
        self.source = model_dir
        self.out_dir = out_dir
        self.config = config
        self.device = torch.device(device)
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model: Any = model.to(self.device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.step = 0
        self.version = 0
        # The service may stop while a step runs in its worker thread: a checkpoint or an
        # export waits for that step instead of saving half-updated weights.
        self._lock = threading.Lock()
        out_dir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ training

    def train(self, items: list[ScoredRollout]) -> StepResult:
        with self._lock:
            return self._train(items)

    def _train(self, items: list[ScoredRollout]) -> StepResult:
        rows = self._rows(items)
        total = int(rows.mask.sum().item()) or 1
        self.optimizer.zero_grad(set_to_none=True)
        parts: list[LossStats] = []
        for start in range(0, len(items), self.config.micro_batch):
            part = slice(start, start + self.config.micro_batch)
            parts.append(self._backward(rows, part, total))
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.step += 1
        return self._result(items, _merge(parts))

    def _backward(self, rows: _Rows, part: slice, total: int) -> LossStats:
        logits = self.model(input_ids=rows.tokens[part], attention_mask=rows.attention[part]).logits
        current = token_logprobs(logits, rows.tokens[part])
        mask = rows.mask[part]
        loss, stats = policy_loss(
            current, rows.behaviour[part], rows.advantages[part], mask, self.config.loss
        )
        # Token-level mean over the whole batch, accumulated micro-batch by micro-batch.
        (loss * (mask.sum() / total)).backward()  # type: ignore[no-untyped-call]
        return stats

    def _rows(self, items: list[ScoredRollout]) -> _Rows:
        length = max(len(unpack_i32(i.rollout.tokens)) for i in items)
        shape = (len(items), length)
        tokens = torch.zeros(shape, dtype=torch.long)
        attention = torch.zeros(shape, dtype=torch.long)
        behaviour = torch.zeros((len(items), length - 1))
        mask = torch.zeros((len(items), length - 1))
        for row, item in enumerate(items):
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
        advantages = group_advantages([i.reward for i in items], [i.rollout.task.id for i in items])
        device = self.device
        return _Rows(
            tokens=tokens.to(device),
            attention=attention.to(device),
            behaviour=behaviour.to(device),
            mask=mask.to(device),
            advantages=advantages.to(device),
        )

    def _result(self, items: list[ScoredRollout], loss: LossStats) -> StepResult:
        by_domain: dict[str, list[float]] = defaultdict(list)
        for item in items:
            by_domain[item.rollout.task.domain].append(item.reward)
        stale = [self.version - (i.rollout.policy_version or self.version) for i in items]
        return StepResult(
            step=self.step,
            samples=len(items),
            reward_mean=statistics.fmean(i.reward for i in items),
            reward_by_domain={d: statistics.fmean(r) for d, r in sorted(by_domain.items())},
            staleness_mean=statistics.fmean(stale),
            loss=loss,
        )

    # ------------------------------------------------------------------ weights, checkpoints

    def export(self, keep: int) -> Exported:
        """Write the weights as version ``self.version + 1`` and make it current."""
        with self._lock:
            return self._export(keep)

    def _export(self, keep: int) -> Exported:
        version = self.version + 1
        target = self.out_dir / "weights" / f"v{version}"
        staging = target.with_name(f".v{version}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        self.model.save_pretrained(str(staging), safe_serialization=True)
        for extra in self.source.iterdir():
            if extra.is_file() and not (staging / extra.name).exists():
                shutil.copy2(extra, staging / extra.name)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        self.version = version
        self._prune(keep)
        return Exported(version=version, path=target, digest=directory_digest(target))

    def _prune(self, keep: int) -> None:
        versions = sorted(
            (p for p in (self.out_dir / "weights").glob("v*") if p.name[1:].isdigit()),
            key=lambda p: int(p.name[1:]),
        )
        for old in versions[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    def save_checkpoint(self) -> Path:
        with self._lock:
            return self._save_checkpoint()

    def _save_checkpoint(self) -> Path:
        path = self.out_dir / CHECKPOINT
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "version": self.version,
            "rng": torch.get_rng_state(),
        }
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        return path

    def resume(self) -> bool:
        path = self.out_dir / CHECKPOINT
        if not path.is_file():
            return False
        state = torch.load(path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.version = int(state["version"])
        torch.set_rng_state(state["rng"])
        return True

    def current_weights(self) -> Exported | None:
        """The published directory of the current version, if it is still on disk."""
        path = self.out_dir / "weights" / f"v{self.version}"
        if self.version == 0 or not path.is_dir():
            return None
        return Exported(version=self.version, path=path, digest=directory_digest(path))


def _merge(parts: list[LossStats]) -> LossStats:
    tokens = sum(p.tokens for p in parts) or 1

    def mean(field: str) -> float:
        return float(sum(getattr(p, field) * p.tokens for p in parts)) / tokens

    return LossStats(
        loss=mean("loss"),
        clip_fraction=mean("clip_fraction"),
        approx_kl=mean("approx_kl"),
        is_weight_mean=mean("is_weight_mean"),
        tokens=tokens,
    )
