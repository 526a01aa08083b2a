"""Learner service: batches from the replay buffer in, policy versions out.

The learner never waits on generation: it asks the replay buffer for a batch (whole
groups within the staleness bound), takes one optimizer step, and every
``publish_every`` steps writes the weights as a Hugging Face directory and announces
them with a PolicyUpdate (version, path, digest).  Training metrics go to the stats
subject, Prometheus and ``OUT_DIR/metrics.jsonl``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.errors import DecodeError
from protocol.messages import Batch, ErrorReply, PolicyUpdate, SampleRequest
from services.learner.loss import LossConfig
from services.learner.metrics import Scalars, step_line
from services.learner.trainer import Exported, StepResult, Trainer, TrainerConfig
from services.runtime.policy import last_policy_update
from services.runtime.service import Service
from services.runtime.settings import RuntimeSettings
from services.runtime.stages import Stages

_BATCH_REPLY: Codec[Batch | ErrorReply] = Codec(Batch | ErrorReply)


@dataclass(frozen=True, kw_only=True)
class LearnerSettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: Starting policy (Hugging Face directory); a checkpoint in ``out_dir`` takes precedence.
    model: Path = Path("models/tiny")
    #: Published weights (``weights/v<N>``), the checkpoint and metrics.jsonl.
    out_dir: Path = Path("run/learner")
    #: Samples per optimizer step (whole groups).
    batch_size: int = 64
    lr: float = 1e-4
    #: Linear decay to ``lr * lr_final`` over this many steps (0: a constant rate).
    lr_decay_steps: int = 0
    lr_final: float = 0.1
    clip_eps: float = 0.2
    is_cap: float = 2.0
    #: k3 KL to the starting policy (0: no reference model is loaded) and entropy bonus.
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    grad_clip: float = 1.0
    micro_batch: int = 16
    #: Optimizer steps per batch = epochs x minibatches, clipped against the batch's start.
    epochs: int = 1
    minibatches: int = 1
    #: Samples of groups whose rewards are all equal skip the forward pass (no gradient).
    skip_zero_advantage: bool = True
    #: Torch intra-op threads; 0 keeps torch's default (every core).  On a machine that
    #: the generator shares, 1 avoids two processes' thread pools spinning on each other.
    threads: int = 0
    #: TensorBoard scalars per step under ``out_dir/tensorboard``.
    tensorboard: bool = True
    #: Staleness bound sent with every request; ``None`` keeps the buffer's.
    max_staleness: int | None = None
    #: Publish a new policy version every this many steps.
    publish_every: int = 1
    checkpoint_every: int = 10
    keep_versions: int = 3
    #: How long the buffer may take to fill a batch; a partial batch is trained on.
    sample_wait_s: float = 5.0
    #: The smallest batch worth a step: the buffer keeps a smaller one until it grows.
    min_samples: int = 8
    device: str = "cpu"
    seed: int = 0

    def trainer_config(self) -> TrainerConfig:
        return TrainerConfig(
            lr=self.lr,
            lr_decay_steps=self.lr_decay_steps,
            lr_final=self.lr_final,
            grad_clip=self.grad_clip,
            micro_batch=self.micro_batch,
            epochs=self.epochs,
            minibatches=self.minibatches,
            skip_zero_advantage=self.skip_zero_advantage,
            loss=LossConfig(
                clip_eps=self.clip_eps,
                is_cap=self.is_cap,
                kl_coef=self.kl_coef,
                entropy_coef=self.entropy_coef,
            ),
            seed=self.seed,
        )


class LearnerService(Service):
    name = "learner"

    def __init__(self, settings: LearnerSettings) -> None:
        super().__init__(settings.runtime)
        self.settings = settings
        self._trainer: Trainer | None = None
        self.last: StepResult | None = None
        self.failures = 0
        self.refused = 0
        self.skipped = 0
        self._scalars: Scalars | None = None

    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise RuntimeError("learner not started")
        return self._trainer

    async def setup(self) -> None:
        settings = self.settings
        if settings.threads:
            import torch

            torch.set_num_threads(settings.threads)
        if settings.tensorboard:
            self._scalars = await asyncio.to_thread(Scalars, settings.out_dir / "tensorboard")
        self._trainer = await asyncio.to_thread(
            Trainer, settings.model, settings.out_dir, settings.trainer_config(), settings.device
        )
        if await asyncio.to_thread(self.trainer.resume):
            self.log.info("resumed", step=self.trainer.step, version=self.trainer.version)
            current = self.trainer.current_weights()
            if current is not None:
                await self._announce(current)
        await self._continue_lineage()

    async def _continue_lineage(self) -> None:
        """Number versions on from the newest one ever announced.

        A learner that lost its checkpoint (or restarts from an older one) would otherwise
        publish versions that generators already serve newer weights under and ignore.
        """
        announced = await last_policy_update(self.bus.js, self.log)
        trainer = self.trainer
        if announced is None or announced.version <= trainer.version:
            return
        self.log.warning(
            "lineage_continued",
            checkpoint_version=trainer.version,
            announced_version=announced.version,
        )
        trainer.version = announced.version
        trainer.consumed = max(trainer.consumed, announced.trained_samples)

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [self._train_loop()]

    async def _train_loop(self) -> None:
        while True:
            stages = Stages()
            with stages.stage("batch"):
                batch = await self._next_batch()
            # The buffer serves nothing below ``min_samples``; what it serves is trained on,
            # since samples handed out are gone from it.
            if batch is None or not batch.items:
                await asyncio.sleep(0.2 if batch is not None else 1.0)
                continue
            with stages.stage("train"):
                result = await asyncio.to_thread(self.trainer.train, batch.items)
            self._account(result)
            if result.skipped:
                await self._report_progress()
                continue
            self.last = result
            await self._after_step(result.step, stages)
            self._record(result, batch, {**stages.seconds, **result.seconds})

    def _account(self, result: StepResult) -> None:
        self.refused += len(result.refused)
        for refusal in result.refused:
            self.log.warning("rollout_refused", rollout=refusal.rollout_id, reason=refusal.reason)
        if result.skipped:
            # Nothing was applied (non-finite updates, or no sample with a gradient): the
            # weights are unchanged, so no version is published for this batch.
            self.skipped += 1
            self.log.warning("step_skipped", samples=result.samples, updates=result.updates)

    async def _next_batch(self) -> Batch | None:
        trainer = self.trainer
        request = SampleRequest(
            id=uuid.uuid4().hex,
            learner_version=trainer.version,
            max_samples=self.settings.batch_size,
            max_staleness=self.settings.max_staleness,
            whole_groups=True,
            wait_s=self.settings.sample_wait_s,
            min_samples=self.settings.min_samples,
        )
        timeout = self.settings.sample_wait_s + 10.0
        try:
            reply = await self.bus.nc.request(
                subjects.replay_sample(), encode(request), timeout=timeout
            )
            answer = _BATCH_REPLY.decode(reply.data)
        except (nats.errors.Error, TimeoutError, DecodeError) as error:
            self.failures += 1
            self.log.warning("no_batch", error=repr(error))
            return None
        if isinstance(answer, ErrorReply):
            self.failures += 1
            self.log.warning("batch_refused", code=answer.code, reason=answer.message)
            return None
        return answer

    async def _after_step(self, step: int, stages: Stages) -> None:
        if step % self.settings.publish_every == 0:
            with stages.stage("export"):
                exported = await asyncio.to_thread(self.trainer.export, self.settings.keep_versions)
            with stages.stage("publish"):
                await self._announce(exported)
        if step % self.settings.checkpoint_every == 0:
            with stages.stage("checkpoint"):
                await asyncio.to_thread(self.trainer.save_checkpoint)

    async def _report_progress(self) -> None:
        """After a batch that changed no weight: the same version, with what was consumed,
        so generators pacing their admission by it are not left waiting."""
        current = self.trainer.current_weights()
        if current is None:
            current = await asyncio.to_thread(self.trainer.export, self.settings.keep_versions)
        await self._announce(current)

    async def _announce(self, exported: Exported) -> None:
        trainer = self.trainer
        update = PolicyUpdate(
            version=exported.version,
            uri=str(exported.path.resolve()),
            digest=exported.digest,
            step=trainer.step,
            created_at=time.time(),
            trained_samples=trainer.consumed,
        )
        msg_id = f"policy-{exported.version}-{exported.digest}-{trainer.consumed}"
        await self.bus.publish(subjects.policy_update(), update, msg_id=msg_id)
        self.log.info("policy_published", version=exported.version, step=self.trainer.step)

    async def teardown(self) -> None:
        if self._trainer is not None and self._trainer.step:
            await asyncio.to_thread(self._trainer.save_checkpoint)
        if self._scalars is not None:
            self._scalars.close()

    def _record(self, result: StepResult, batch: Batch, seconds: dict[str, float]) -> None:
        line = step_line(result, self.trainer.version, batch.dropped_stale, seconds)
        with (self.settings.out_dir / "metrics.jsonl").open("a") as out:
            out.write(json.dumps(line) + "\n")
        if self._scalars is not None:
            self._scalars.add(line, result.step)
        self.log.info(
            "step", step=result.step, reward=round(result.reward_mean, 4), samples=result.samples
        )

    def health(self) -> tuple[bool, str]:
        ok, detail = super().health()
        if self._trainer is None:
            return False, "loading"
        return ok, detail or f"step={self._trainer.step} version={self._trainer.version}"

    def statistics(self) -> dict[str, float]:
        values = super().statistics()
        values["batch_failures"] = float(self.failures)
        values["refused_rollouts"] = float(self.refused)
        values["skipped_steps"] = float(self.skipped)
        if self._trainer is not None:
            values["step"] = float(self._trainer.step)
            values["policy_version"] = float(self._trainer.version)
        last = self.last
        if last is not None:
            values["reward_mean"] = last.reward_mean
            values["staleness_mean"] = last.staleness_mean
            values["clip_fraction"] = last.loss.clip_fraction
            values["approx_kl"] = last.loss.approx_kl
            values["entropy"] = last.loss.entropy
            values["diversity"] = last.diversity
            for domain, reward in last.reward_by_domain.items():
                values[f"reward.{domain}"] = reward
        return values
