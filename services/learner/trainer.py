"""The learner's model, optimizer and step, on torch: one call trains on one batch.

Weights are published as Hugging Face directories (safetensors plus the tokenizer and
config of the starting model), so the torch engine and SGLang load them as they are.
A checkpoint (model, optimizer, RNG, step, version and the caller's extra state, such as
the ledger position) is written durably, the last K kept, and resumed exactly.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from protocol.messages import FinishReason, ScoredRollout
from services.evaluation.figures import DomainFigures
from services.learner import domain_figures
from services.learner.checkpoints import CheckpointStore, Loaded
from services.learner.checkpoints import read as read_checkpoint
from services.learner.forward import trained_logprobs
from services.learner.loss import (
    LossConfig,
    LossStats,
    TokenTerms,
    policy_loss,
)
from services.learner.mismatch import NOT_MEASURED, Mismatch, merge
from services.learner.reward_bounds import RewardBounds
from services.learner.rows import ModelLimits, Refusal, Rows
from services.learner.rows import build as rows_of
from services.model.load import default_dtype, load_causal_lm
from services.model.weights import directory_digest, write_weights
from services.runtime.logs import get_logger
from services.runtime.settings import FLAT, NOT_FROM_ENV
from services.runtime.stages import Stages

if TYPE_CHECKING:
    from services.learner.distributed import DataParallel

_log = get_logger(component="trainer")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    lr: float = 1e-4
    #: The learning rate falls linearly from ``lr`` to ``lr * lr_final`` over this many
    #: steps, then stays there (0: constant).  Late in a run a policy that has sharpened
    #: flips answers with every full-size step; smaller ones keep what it learnt.
    lr_decay_steps: int = 0
    lr_final: float = 0.1
    #: AdamW's decoupled weight decay (0: none).
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    #: Rows of a micro-batch (one forward and backward; gradients add up over a minibatch),
    #: at most, and its padded tokens (rows times its longest row's length), at most: the
    #: attention of a micro-batch grows with the square of its length, and one long
    #: sample padded 15 short ones to it.  A row longer than ``micro_tokens`` goes alone.
    micro_batch: int = 16
    micro_tokens: int = 4096
    #: Run each distinct prompt once for the rows that share it (a task's samples): a
    #: 64-token prompt and 10-token answers cost 144 positions a group of 8, not 592.
    #: Sharded (FSDP) training runs every row whole whatever this says
    #: (``forward._whole_pass``).
    share_prompts: bool = True
    #: Passes over each batch, and optimizer steps per pass: ``epochs * minibatches``
    #: updates per batch, each clipped against the policy at the start of the batch.
    epochs: int = 1
    minibatches: int = 1
    #: Leave out of the forward pass the samples whose advantage is 0 (groups whose
    #: rewards are all equal): they add no gradient, only cost.  Ignored when a KL or an
    #: entropy term gives them one.
    skip_zero_advantage: bool = True
    #: Its fields are set as the learner's own (``TEMPER_LEARNER_CLIP_EPS``).
    loss: LossConfig = field(default_factory=LossConfig, metadata=FLAT)
    seed: int = 0
    #: Checkpoints kept: a damaged newest one falls back to the one before.
    keep_checkpoints: int = 3
    #: Rewards outside their domain's declared range are refused.  Built from the
    #: domain config (``LearnerSettings.rewards``), never read from the environment.
    rewards: RewardBounds = field(default_factory=RewardBounds, metadata=NOT_FROM_ENV)

    def __post_init__(self) -> None:
        for name in ("micro_batch", "micro_tokens", "epochs", "minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.lr_decay_steps < 0 or not 0 <= self.lr_final <= 1:
            raise ValueError(
                f"lr_decay_steps must be >= 0 and lr_final in [0, 1], not "
                f"{self.lr_decay_steps} and {self.lr_final}"
            )

    @property
    def updates(self) -> int:
        return self.epochs * self.minibatches

    def lr_at(self, step: int) -> float:
        """The learning rate of the step after ``step`` steps."""
        if not self.lr_decay_steps:
            return self.lr
        done = min(step, self.lr_decay_steps) / self.lr_decay_steps
        return self.lr * (1.0 - (1.0 - self.lr_final) * done)


@dataclass(frozen=True, kw_only=True)
class StepResult:
    step: int
    samples: int
    #: Samples that went through the forward pass (the rest had advantage 0).
    trained: int
    reward_mean: float
    reward_by_domain: dict[str, float]
    staleness_mean: float
    loss: LossStats
    #: Optimizer steps applied (``epochs * minibatches`` unless some were non-finite).
    updates: int
    #: Malformed rollouts left out of the step, each with the reason.
    refused: list[Refusal]
    #: No update was applied (every one was non-finite, or nothing was left to train).
    skipped: bool
    #: Mean share of distinct completions per group (1 = all different, 1/n = collapsed).
    diversity: float
    completion_len: float
    #: Share of samples cut at the token limit.
    truncated: float
    #: Per domain: samples at the top score and their length, the reward histogram.
    domains: dict[str, DomainFigures] = field(default_factory=dict)
    #: Seconds per stage of the step: ``rows`` (unpacking), ``proximal`` and ``reference``
    #: (no-grad passes), ``updates`` (forward, backward and optimizer steps).
    seconds: dict[str, float] = field(default_factory=dict)
    #: The learning rate the updates used.
    lr: float = 0.0
    #: Versions behind the learner -> samples of the batch that lag by that many; the
    #: mean alone hides a long tail of very stale samples.
    staleness_counts: dict[int, int] = field(default_factory=dict)
    #: ``|learner - behaviour|`` logprob (mean, max, tokens) over the trained tokens of
    #: the samples that the learner's weights at the start of the step generated, before
    #: any update: numerics of engine and dtype only, unless the learner trains on
    #: something other than what was sampled.  0 tokens: no such sample this step.
    logprob_mismatch: float = 0.0
    logprob_mismatch_max: float = 0.0
    logprob_mismatch_tokens: int = 0
    #: The engines that sampled the measured samples (sorted, comma-separated) and the
    #: dtype the learner computes in: what the mismatch is judged against.
    engine: str = ""
    dtype: str = ""


@dataclass(frozen=True, kw_only=True)
class Exported:
    version: int
    path: Path
    digest: str


class NonFinite(ArithmeticError):
    """A minibatch's loss or gradient was NaN or infinite; its update is not applied."""


class Trainer:
    def __init__(
        self,
        model_dir: Path,
        out_dir: Path,
        config: TrainerConfig,
        device: str = "cpu",
        parallel: DataParallel | None = None,
    ):

        torch.manual_seed(config.seed)
        self.source = model_dir
        self.out_dir = out_dir
        self.config = config
        self.device = torch.device(device)
        # Master weights and optimizer state in float32 everywhere; on a GPU the forward
        # passes run in the dtype policy's bf16 under autocast (see services/learner/forward.py).
        self.model: Any = load_causal_lm(model_dir, self.device, torch.float32)
        self.model.train()
        #: Under torchrun: this rank's share of the micro-batches and the gradient sum.
        self._parallel = parallel
        if parallel is not None:
            parallel.prepare(self.model)
        self._limits = ModelLimits.of(self.model, config.rewards)
        self._config_json: str = self.model.config.to_json_string()
        self.reference: Any = None
        if config.loss.kl_coef:
            reference = load_causal_lm(model_dir, self.device)
            self.reference = reference.eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self._shuffle = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.version = 0
        #: (version, step): the model held exactly that published version's weights
        #: after that many steps; the mismatch is measured only while it still does.
        self._weights_of = (0, 0)
        #: Samples handed to ``train`` so far, whether they moved the weights or not.
        self.consumed = 0
        #: Samples the replay buffer let go untrained on their way here (stale, excluded):
        #: with ``consumed``, what has settled for the generators' admission.
        self.dropped = 0
        # The service may stop while a step runs in its worker thread: a checkpoint or an
        # export waits for that step instead of saving half-updated weights.
        self._lock = threading.Lock()
        out_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoints = CheckpointStore(out_dir, config.keep_checkpoints)
        #: The checkpoint file resumed from or saved last: under torchrun, the other ranks
        #: load the optimizer state and position of this one.
        self.checkpoint: Path | None = None
        #: The published weights taken after that checkpoint, if any: a sharded model's
        #: other ranks load them too (a replicated one takes rank 0's by broadcast).
        self.weights_from: Path | None = None

    # ------------------------------------------------------------------ training

    def train(self, items: list[ScoredRollout]) -> StepResult:
        with self._lock:
            return self._train(items)

    def _train(self, items: list[ScoredRollout]) -> StepResult:
        self.consumed += len(items)
        refused = [
            r for r in (self._limits.problem(i) or self._from_the_future(i) for i in items) if r
        ]
        bad = {r.rollout_id for r in refused}
        valid = [i for i in items if i.id not in bad]
        stages = Stages()
        with stages.stage("rows"):
            rows = self._rows(valid, self._version_held()) if valid else None
        parts: list[LossStats] = []
        mismatch = NOT_MEASURED
        lr = self.config.lr_at(self.step)
        if rows is not None and len(rows):
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            parts, mismatch = self._optimise(rows, stages)
        applied = len(parts)
        if applied:
            self.step += 1
        result = self._result(items, valid, rows, parts, refused)
        return dataclasses.replace(
            result,
            seconds=stages.seconds,
            lr=lr,
            logprob_mismatch=mismatch.mean,
            logprob_mismatch_max=mismatch.max,
            logprob_mismatch_tokens=mismatch.tokens,
            engine=rows.engines if rows is not None and mismatch.tokens else "",
            dtype=str(default_dtype(self.device)).removeprefix("torch."),
        )

    def _version_held(self) -> int | None:
        """The published version whose weights the model holds now; None once a step has
        moved them since (``publish_every`` > 1).  Ranks other than 0 never export: they
        learn a new version from rank 0's step message, when the weights are still that
        version's (no step between), so noting it at the first step that sees it gives
        every rank the same answer."""
        version, step = self._weights_of
        if version != self.version:
            self._weights_of = (self.version, self.step)
            return self.version
        return version if step == self.step else None

    def _from_the_future(self, item: ScoredRollout) -> Refusal | None:
        versions = [s.version for s in item.rollout.segments if s.version is not None]
        newest = max(versions, default=0)
        if newest <= self.version:
            return None
        reason = f"negative staleness: behaviour version {newest} > learner version {self.version}"
        return Refusal(rollout_id=item.id, reason=reason, kind="negative_staleness")

    def _optimise(self, rows: Rows, stages: Stages) -> tuple[list[LossStats], Mismatch]:
        """``epochs * minibatches`` clipped updates: the statistics of those applied, and
        the mismatch of the logprobs before the first, taken from the forward passes the
        step runs anyway: the proximal pass, or with a single update its own forward."""
        proximal = reference = None
        mismatch = NOT_MEASURED
        if self.config.updates > 1:
            with stages.stage("proximal"):
                proximal = self._logprobs(self.model, rows)
                mismatch = rows.mismatch(proximal)
        if self.reference is not None:
            with stages.stage("reference"):
                reference = self._logprobs(self.reference, rows)
        seen: list[Mismatch] = []
        with stages.stage("updates"):
            applied = self._updates(rows, proximal, reference, seen)
            if proximal is None:
                mismatch = self._across_ranks(merge(seen))
        return applied, mismatch

    def _across_ranks(self, mismatch: Mismatch) -> Mismatch:
        """Under torchrun each rank saw its own micro-batches: the whole batch's."""
        if self._parallel is None:
            return mismatch
        return self._parallel.reduce_mismatch(mismatch)

    def _updates(
        self,
        rows: Rows,
        proximal: torch.Tensor | None,
        reference: torch.Tensor | None,
        seen: list[Mismatch],
    ) -> list[LossStats]:
        applied: list[LossStats] = []
        for _ in range(self.config.epochs):
            for shuffled in self._minibatches(len(rows)):
                index = rows.longest_first(shuffled)
                part = _Part(
                    rows=rows.select(index),
                    proximal=None if proximal is None else proximal[index],
                    reference=None if reference is None else reference[index],
                    seen=seen,
                )
                try:
                    applied.append(self._update(part))
                except NonFinite as error:
                    self.optimizer.zero_grad(set_to_none=True)
                    _log.warning("update_skipped", step=self.step + 1, reason=str(error))
        return applied

    def _minibatches(self, rows: int) -> list[torch.Tensor]:
        if self.config.minibatches == 1:
            return [torch.arange(rows, device=self.device)]
        order = torch.randperm(rows, generator=self._shuffle).to(self.device)
        return list(order.tensor_split(min(self.config.minibatches, rows)))

    def _update(self, part: _Part) -> LossStats:
        self.optimizer.zero_grad(set_to_none=True)
        total = int(part.rows.mask.sum().item()) or 1
        stats: list[LossStats] = []
        for micro in self._micro_batches(part.rows):
            stats.append(self._backward(part, micro, total))
        if self._parallel is not None:
            # Every rank leaves with the whole minibatch's gradient and statistics.
            stats = self._parallel.reduce(self.model, stats)
        merged = _merge(stats)
        if not math.isfinite(merged.loss):
            raise NonFinite(f"loss is {merged.loss}")
        norm = self._clip()
        if not torch.isfinite(norm):
            raise NonFinite(f"gradient norm is {float(norm)}")
        self.optimizer.step()
        return dataclasses.replace(merged, grad_norm=float(norm))

    def _share_prompts(self) -> bool:
        sharded = self._parallel is not None and self._parallel.sharded
        return self.config.share_prompts and not sharded

    def _clip(self) -> torch.Tensor:
        if (sharding := self._sharding()) is not None:
            return sharding.clip(self.model, self.config.grad_clip)
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)

    def _micro_batches(self, rows: Rows) -> list[slice]:
        """Micro-batches of ``rows`` (ordered longest first)."""
        slices = self._cut(rows)
        if self._parallel is None:
            return slices
        if self._parallel.sharded and len(slices) % self._parallel.world_size:
            slices = _even_slices(slices, len(rows), self._parallel.world_size)
        return self._parallel.share(slices)

    def _cut(self, rows: Rows) -> list[slice]:
        lengths = [int(n) for n in rows.attention.sum(-1).tolist()]
        return _cut(lengths, self.config.micro_batch, self.config.micro_tokens)

    def _backward(self, part: _Part, micro: slice, total: int) -> LossStats:
        rows = part.rows
        forward = trained_logprobs(
            self.model, rows, micro, entropy=True, share_prompts=self._share_prompts()
        )
        current, spread = forward.logprobs, forward.entropy
        assert spread is not None
        terms = TokenTerms(
            current=current,
            proximal=current.detach() if part.proximal is None else part.proximal[micro],
            behaviour=rows.behaviour[micro],
            mask=rows.mask[micro],
            entropy=spread if self.config.loss.entropy_coef else spread.detach(),
            reference=None if part.reference is None else part.reference[micro],
        )
        if part.proximal is None:
            # A single update: this forward is the policy before it, as a proximal pass is.
            part.seen.append(rows.mismatch(terms.proximal, micro))
        loss, stats = policy_loss(terms, rows.advantages[micro], self.config.loss)
        # Token-level mean over the whole minibatch, accumulated micro-batch by micro-batch.
        (loss * (terms.mask.sum() / total)).backward()  # type: ignore[no-untyped-call]
        return stats

    @torch.no_grad()
    def _logprobs(self, model: Any, rows: Rows) -> torch.Tensor:
        """Logprobs of ``rows`` under ``model`` (the proximal or the reference policy)."""
        was_training = model.training
        model.eval()
        order = rows.longest_first()
        out = torch.zeros_like(rows.mask)
        for s in self._cut(rows.select(order)):
            shared = self._share_prompts()
            out[order[s]] = trained_logprobs(model, rows, order[s], share_prompts=shared).logprobs
        model.train(was_training)
        return out

    def _rows(self, items: list[ScoredRollout], held: int | None = None) -> Rows | None:
        """The rows to train on; those sampled by version ``held`` (if any) are measured."""
        skip_zero = self.config.skip_zero_advantage and not self._regularised()
        return rows_of(items, held=held, skip_zero=skip_zero, device=self.device)

    def _regularised(self) -> bool:
        return bool(self.config.loss.kl_coef or self.config.loss.entropy_coef)

    def _result(
        self,
        items: list[ScoredRollout],
        valid: list[ScoredRollout],
        rows: Rows | None,
        parts: list[LossStats],
        refused: list[Refusal],
    ) -> StepResult:
        counted = valid or items
        by_domain: dict[str, list[float]] = defaultdict(list)
        for item in counted:
            by_domain[item.rollout.task.domain].append(item.reward)
        stale = [self.version - (i.rollout.policy_version or self.version) for i in counted]
        lengths = [len(i.rollout.logprobs) // 4 for i in counted]
        return StepResult(
            step=self.step,
            samples=len(valid),
            trained=0 if rows is None else len(rows),
            reward_mean=statistics.fmean(i.reward for i in counted) if counted else 0.0,
            reward_by_domain={d: statistics.fmean(r) for d, r in sorted(by_domain.items())},
            staleness_mean=statistics.fmean(stale) if stale else 0.0,
            staleness_counts=dict(sorted(Counter(stale).items())),
            loss=_merge(parts),
            updates=len(parts),
            refused=refused,
            skipped=not parts,
            diversity=_diversity(counted),
            completion_len=statistics.fmean(lengths) if lengths else 0.0,
            truncated=_share(counted, lambda i: i.rollout.finish_reason is FinishReason.LENGTH),
            domains=domain_figures.figures(counted, self.config.rewards),
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
        weights = self.model if self._sharding() is None else self._model_state()
        digest = write_weights(weights, self._config_json, self.source, staging)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        self.version = version
        self._weights_of = (version, self.step)
        self._prune(keep)
        return Exported(version=version, path=target, digest=digest)

    def _prune(self, keep: int) -> None:
        versions = sorted(
            (p for p in (self.out_dir / "weights").glob("v*") if p.name[1:].isdigit()),
            key=lambda p: int(p.name[1:]),
        )
        for old in versions[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    def save_checkpoint(self, extra: dict[str, Any] | None = None) -> Path:
        """Write the state; ``extra`` (JSON-like, e.g. the ledger position) rides along and
        comes back from :meth:`resume`."""
        with self._lock:
            self.checkpoint = self.checkpoints.save(self._state(extra or {}), self.version)
            self.weights_from = None  # the checkpoint holds them now
            return self.checkpoint

    def _state(self, extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "model": self._model_state(),
            "optimizer": self._optimizer_state(),
            "step": self.step,
            "version": self.version,
            "rng": torch.get_rng_state(),
            "shuffle": self._shuffle.get_state(),
            "consumed": self.consumed,
            "dropped": self.dropped,
            "weights_of": list(self._weights_of),
            "extra": extra,
        }

    def _sharding(self) -> DataParallel | None:
        """The ranks when they shard the model: its state is then read by gathers that
        every rank joins (see ``gather``) and loaded shard by shard."""
        parallel = self._parallel
        return parallel if parallel is not None and parallel.sharded else None

    def _model_state(self) -> dict[str, torch.Tensor]:
        if (sharding := self._sharding()) is not None:
            return sharding.full_state(self.model)
        state: dict[str, torch.Tensor] = self.model.state_dict()
        return state

    def _optimizer_state(self) -> dict[str, Any]:
        if (sharding := self._sharding()) is not None:
            return sharding.full_optimizer_state(self.model, self.optimizer)
        return self.optimizer.state_dict()

    def gather(self, optimizer: bool) -> None:
        """A rank other than 0's part in rank 0's export (or checkpoint, with
        ``optimizer``) of a sharded model: the same gathers, their results dropped."""
        with self._lock:
            self._model_state()
            if optimizer:
                self._optimizer_state()

    def resume(self) -> Loaded | None:
        """Load the newest readable checkpoint (skipping damaged ones); None if none."""
        loaded = self.checkpoints.load_newest(self.device)
        if loaded is None:
            return None
        self._load(loaded.state)
        self.checkpoint = loaded.path
        return loaded

    def load_checkpoint(self, path: Path) -> None:
        """Load the checkpoint at ``path`` (the one another rank resumed from or saved)."""
        self._load(read_checkpoint(path, self.device))
        self.checkpoint = path

    def _load(self, state: dict[str, Any]) -> None:
        if (sharding := self._sharding()) is not None:
            sharding.load(self.model, self.optimizer, state["model"], state["optimizer"])
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.version = int(state["version"])
        if "rng" in state:
            torch.set_rng_state(state["rng"])
        if "shuffle" in state:
            self._shuffle.set_state(state["shuffle"])
        self.consumed = int(state.get("consumed", 0))
        self.dropped = int(state.get("dropped", 0))
        # Without the record (an older checkpoint) the weights may have moved past the
        # version: nothing is measured until the next one.
        version, step = state.get("weights_of", (self.version, -1))
        self._weights_of = (int(version), int(step))

    def load_weights(self, path: Path, *, version: int, step: int, samples: int) -> None:
        """Take the weights of a published directory (newer than the checkpoint resumed
        from) as version ``version`` after ``step`` steps; ``samples`` more consumed."""

        published = load_causal_lm(path)
        with self._lock:
            if (sharding := self._sharding()) is not None:
                sharding.load(self.model, None, published.state_dict(), None)
            else:
                self.model.load_state_dict(published.state_dict())
            self.weights_from = path
            self.version, self.step = version, step
            self._weights_of = (version, step)
            self.consumed += samples

    @property
    def settled(self) -> int:
        """Samples that will never come back to be trained: consumed, or dropped."""
        return self.consumed + self.dropped

    def current_weights(self) -> Exported | None:
        """The published directory of the current version, if it is still on disk."""
        path = self.out_dir / "weights" / f"v{self.version}"
        if self.version == 0 or not path.is_dir():
            return None
        return Exported(version=self.version, path=path, digest=directory_digest(path))


@dataclass(frozen=True, kw_only=True)
class _Part:
    """One minibatch: its rows and, when computed, their proximal and reference logprobs."""

    rows: Rows
    proximal: torch.Tensor | None
    reference: torch.Tensor | None
    #: Without a proximal pass: the mismatch of each micro-batch's forward, collected.
    seen: list[Mismatch]


def _cut(lengths: list[int], most_rows: int, most_tokens: int) -> list[slice]:
    """Consecutive slices of rows (ordered a prompt at a time, longest first): each holds
    at most ``most_rows`` rows and as many as fit ``most_tokens`` padded to its longest."""
    slices, start = [], 0
    while start < len(lengths):
        end, width = start + 1, lengths[start]
        while end < len(lengths) and end - start < most_rows:
            wider = max(width, lengths[end])
            if wider * (end - start + 1) > most_tokens:
                break
            end, width = end + 1, wider
        slices.append(slice(start, end))
        start = end
    return slices


def _even_slices(slices: list[slice], total: int, ranks: int) -> list[slice]:
    """``total`` rows in the next multiple of ``ranks`` above ``len(slices)`` micro-batches,
    as even as can be (so none grows): FSDP needs as many on every rank.  With fewer rows
    than that, ``slices`` stay as they are, for ``share`` to refuse."""
    wanted = -(-len(slices) // ranks) * ranks
    if wanted > total:
        return slices
    return [slice(total * i // wanted, total * (i + 1) // wanted) for i in range(wanted)]


def _diversity(items: list[ScoredRollout]) -> float:
    groups: dict[str, list[str]] = defaultdict(list)
    for item in items:
        rollout = item.rollout
        groups[rollout.task.id].append(rollout.completion_text or rollout.tokens.hex())
    shares = [len(set(texts)) / len(texts) for texts in groups.values() if len(texts) > 1]
    return statistics.fmean(shares) if shares else 1.0


def _share(items: list[ScoredRollout], test: Callable[[ScoredRollout], bool]) -> float:
    return sum(1 for i in items if test(i)) / len(items) if items else 0.0


def _merge(parts: list[LossStats]) -> LossStats:
    tokens = sum(p.tokens for p in parts)

    def mean(name: str) -> float:
        return float(sum(getattr(p, name) * p.tokens for p in parts)) / (tokens or 1)

    names = [f.name for f in dataclasses.fields(LossStats) if f.name != "tokens"]
    return LossStats(**{name: mean(name) for name in names}, tokens=tokens)
