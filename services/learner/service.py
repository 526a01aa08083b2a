"""Learner service: batches from the replay buffer in, policy versions out.

The learner never waits on generation: it asks the replay buffer for a batch (whole
groups within the staleness bound), takes one optimizer step, and every
``publish_every`` steps writes the weights as a Hugging Face directory and announces
them with a PolicyUpdate (version, path, digest).  Training metrics go to the stats
subject, Prometheus and ``OUT_DIR/metrics.jsonl``.

Exactly-once: batches are leased, not acked, when served.  Every step is recorded in
the provenance ledger (``OUT_DIR/ledger.jsonl``); a checkpoint is taken every
``checkpoint_every`` batches (or sooner when ``commit_samples`` are waiting), and the
rollouts of the interval before it are then committed, so the buffer acks them for
good.  Commits trail one checkpoint so that a damaged newest checkpoint loses nothing.
A learner that restarts resumes its newest readable checkpoint, releases the leases it
did not commit (the buffer serves them again) and recognises, by the ledger, rollouts it
had trained already, which it commits without training them twice.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import nats.errors

from protocol import subjects
from protocol.messages import (
    Batch,
    BatchCommit,
    CommitReply,
    LeaseRelease,
    PolicyUpdate,
    SampleRequest,
    ScoredRollout,
)
from services.learner.acks import WeightAcks
from services.learner.broadcast import WeightServer, make_weight_server
from services.learner.checkpoints import Loaded
from services.learner.ledger import Consumed, Ledger, StepRecord
from services.learner.metrics import Scalars, step_line
from services.learner.published import Published, newest_published
from services.learner.settings import LearnerSettings
from services.learner.trainer import Exported, StepResult, Trainer
from services.replay.client import ReplayClient
from services.runtime.ask import AskError, AskTimeout, BadReply, Refused
from services.runtime.policy import last_policy_update
from services.runtime.service import Service
from services.runtime.stages import Stages

if TYPE_CHECKING:
    from services.learner.ranks import Leader

#: How long an announcement is tried again while the policy stream does not answer
#: (several leader elections of a NATS cluster) before the learner gives up.
ANNOUNCE_PATIENCE_S = 60.0


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
        #: Rollouts served again after they were trained: committed, not trained twice.
        self.served_again = 0
        self.commits = 0
        self.commit_failures = 0
        #: Rollouts sampled by a version newer than the learner's (lineage rules it out).
        self.negative_staleness = 0
        self._scalars: Scalars | None = None
        self._ledger = Ledger(settings.out_dir)
        self.acks = WeightAcks(settings.weights.acks(), self.log)
        self.weights: WeightServer | None = make_weight_server(
            settings.weights.weight_transport, settings.weights.broadcast(), self.instance, self.log
        )
        self._since_checkpoint = 0
        #: The version announced last, with its digest (for the ledger).
        self._exported: Exported | None = None
        #: The step in flight (train, publish, record): finished even when the service
        #: stops, so no weight change goes unrecorded.
        self._current: asyncio.Future[None] | None = None
        #: Under torchrun, rank 0's link to the other ranks (``services.learner.ranks``).
        self.ranks: Leader | None = None
        self._reached_max_steps = False

    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise RuntimeError("learner not started")
        return self._trainer

    async def setup(self) -> None:
        settings = self.settings
        self.acks.listen(self)
        if self.weights is not None:
            self.weights.listen(self)
        if settings.threads:
            import torch

            torch.set_num_threads(settings.threads)
        if settings.tensorboard:
            self._scalars = await asyncio.to_thread(Scalars, settings.out_dir / "tensorboard")
        self._trainer = await asyncio.to_thread(
            Trainer,
            settings.model,
            settings.out_dir,
            settings.trainer_config(),
            settings.device,
            self.ranks.parallel if self.ranks is not None else None,
        )
        await self._resume()
        await self._continue_lineage()
        if self.ranks is not None:
            await asyncio.to_thread(self.ranks.synchronise, self.trainer)
        if settings.commits.lease:
            # What the checkpoint covers is committed first, so that the release puts back
            # only what the abandoned steps used.
            await self._commit(all_closed=True)
            await self._release_leases()

    async def _resume(self) -> None:
        """The newest consistent state: the newest readable checkpoint, or a version
        published after it whose weights are on disk and match the ledger's digest."""
        loaded = await asyncio.to_thread(self.trainer.resume)
        trainer = self.trainer
        state = loaded.state.get("extra", {}).get("ledger", {}) if loaded else {}
        position = int(state.get("position", 0))
        recent = list(state.get("recent", []))
        uncommitted = list(state.get("uncommitted", []))
        published = await asyncio.to_thread(
            newest_published,
            self._ledger.path,
            position,
            self.settings.out_dir / "weights",
            trainer.version,
        )
        if published is not None:
            await self._take_published(published)
            position = published.position
            recent += published.trained
            uncommitted += published.commit
        self._ledger.resume(
            position=position,
            recent=recent,
            uncommitted=uncommitted,
            step=trainer.step,
            version=trainer.version,
        )
        if published is not None:
            # The steps those weights embody become durable in a checkpoint before their
            # rollouts are committed.
            await self._checkpoint()
        if loaded is not None or published is not None:
            self._log_resumed(loaded)
            current = trainer.current_weights()
            if current is not None:
                await self._announce(current)

    async def _take_published(self, published: Published) -> None:
        trainer = self.trainer
        self.log.warning(
            "resumed_from_published",
            checkpoint_version=trainer.version,
            version=published.version,
            step=published.step,
            rollouts=len(published.trained),
        )
        await asyncio.to_thread(
            trainer.load_weights,
            published.path,
            version=published.version,
            step=published.step,
            samples=len(published.trained),
        )

    def _log_resumed(self, loaded: Loaded | None) -> None:
        trainer = self.trainer
        self.log.info(
            "resumed",
            step=trainer.step,
            version=trainer.version,
            checkpoint=str(loaded.path) if loaded else None,
            skipped_unreadable=[str(e.path) for e in loaded.skipped] if loaded else [],
        )

    async def _release_leases(self) -> None:
        """What an earlier run of this learner leased and never committed is served again."""
        release = LeaseRelease(id=uuid.uuid4().hex, learner=self.instance)
        reply = await self._commit_request(release)
        if reply is not None:
            self.log.info("leases_released", rollouts=reply.released)

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
        trainer.dropped = max(trainer.dropped, announced.settled_samples - trainer.consumed)

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [self._train_loop(), self.acks.run()]

    async def _train_loop(self) -> None:
        while True:
            max_steps = self.settings.sampling.max_steps
            if max_steps and self.trainer.step >= max_steps:
                await self._after_last_step()
                continue
            stages = Stages()
            with stages.stage("batch"):
                batch = await self._next_batch()
            if batch is not None:
                # Acked by the buffer as it served: counted here, kept with the checkpoint
                # (a crash before the next one forgets these few, and admission is that
                # much stricter).
                self.trainer.dropped += batch.dropped_stale + batch.excluded
            # The buffer serves nothing below ``min_samples``; what it serves is leased to
            # this learner until committed, and trained on.
            if batch is None or not batch.items:
                if batch is not None:
                    await self._settle()
                if self.ranks is not None:
                    await asyncio.to_thread(self.ranks.idle)
                await asyncio.sleep(0.2 if batch is not None else 1.0)
                continue
            self._current = asyncio.ensure_future(self._step(batch, stages))
            await asyncio.shield(self._current)
            self._current = None

    async def _step(self, batch: Batch, stages: Stages) -> None:
        fresh = [i for i in batch.items if not self._ledger.trained(i.id)]
        again = [i.id for i in batch.items if self._ledger.trained(i.id)]
        if again:
            self.served_again += len(again)
            self.log.warning("served_again", rollouts=len(again), batch=batch.request_id)
        result = None
        published = False
        if fresh:
            with stages.stage("train"):
                result = await asyncio.to_thread(self._train, fresh)
            self._account(result)
        if result is not None and result.skipped:
            await self._report_progress()
        elif result is not None:
            self.last = result
            published = await self._publish(result.step, stages)
        self._ledger.record_step(self._step_record(batch, fresh, again, result, published))
        self._since_checkpoint += 1
        await self._maybe_checkpoint(stages)
        if result is not None and not result.skipped:
            self._record(result, batch, {**stages.seconds, **result.seconds})

    def _train(self, items: list[ScoredRollout]) -> StepResult:
        """One step; under torchrun every rank takes it, on the batch rank 0 hands them."""
        if self.ranks is None:
            return self.trainer.train(items)
        return self.ranks.train(self.trainer, items)

    def _step_record(
        self,
        batch: Batch,
        fresh: list[ScoredRollout],
        again: list[str],
        result: StepResult | None,
        published: bool,
    ) -> StepRecord:
        trainer = self.trainer
        exported = self._exported
        return StepRecord(
            step=trainer.step,
            applied=result is not None and not result.skipped,
            published=published,
            version=trainer.version,
            digest=exported.digest if exported and exported.version == trainer.version else "",
            batch=batch.request_id,
            rollouts=[
                Consumed(
                    rollout_id=i.id,
                    version=_behaviour_version(i),
                    trace_id=batch.traces.get(i.id, ""),
                )
                for i in fresh
            ],
            again=again,
        )

    def _account(self, result: StepResult) -> None:
        self.refused += len(result.refused)
        for refusal in result.refused:
            if refusal.kind == "negative_staleness":
                self.negative_staleness += 1
                self.log.error(
                    "negative_staleness", rollout=refusal.rollout_id, reason=refusal.reason
                )
            else:
                self.log.warning(
                    "rollout_refused", rollout=refusal.rollout_id, reason=refusal.reason
                )
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
            max_samples=self.settings.sampling.batch_size,
            max_staleness=self.settings.sampling.max_staleness,
            whole_groups=True,
            wait_s=self.settings.sampling.sample_wait_s,
            min_samples=self.settings.sampling.min_samples,
            lease=self.settings.commits.lease,
        )
        timeout = self.settings.sampling.sample_wait_s + 10.0
        try:
            return await ReplayClient(self.bus).sample(request, timeout)
        except Refused as error:
            self.failures += 1
            self.log.warning("batch_refused", code=error.code, reason=error.message)
            return None
        except AskError as error:
            self.failures += 1
            self.log.warning("no_batch", error=repr(error))
            if self.settings.commits.lease and isinstance(error, AskTimeout | BadReply):
                # The buffer may have leased a batch whose reply never arrived: put it back.
                # Leases of rollouts trained here come back too, and are only committed.
                await self._release_leases()
            return None

    async def _publish(self, step: int, stages: Stages) -> bool:
        """Export and announce a new version when one is due; True if one was."""
        if step % self.settings.weights.publish_every:
            return False
        with stages.stage("export"):
            exported = await asyncio.to_thread(self._export)
        with stages.stage("publish"):
            await self._announce(exported)
        return True

    async def _maybe_checkpoint(self, stages: Stages) -> None:
        waiting = self._ledger.waiting()
        if (
            self._since_checkpoint < self.settings.commits.checkpoint_every
            and waiting < self.settings.commits.commit_samples
        ):
            return
        with stages.stage("checkpoint"):
            await self._checkpoint()
        with stages.stage("commit"):
            await self._commit(all_closed=False)

    async def _after_last_step(self) -> None:
        if not self._reached_max_steps:
            self._reached_max_steps = True
            self.log.info("max_steps_reached", step=self.trainer.step)
        await self._settle()
        if self.ranks is not None:
            await asyncio.to_thread(self.ranks.idle)
        await asyncio.sleep(1.0)

    async def _settle(self) -> None:
        """The buffer has nothing to serve: commit everything trained.  Leased rollouts
        count against the buffer's capacity, so waiting for the next checkpoint could
        leave it full of them and the learner with nothing to train on."""
        if not self._ledger.waiting(all_intervals=True):
            return
        if self._since_checkpoint:
            await self._checkpoint()
        await self._commit(all_closed=True)

    async def _checkpoint(self) -> None:
        """Checkpoint with the ledger's position, which then closes its interval."""
        ledger = self._ledger
        await asyncio.to_thread(ledger.flush)
        extra = {
            "ledger": {
                "position": ledger.position,
                "recent": ledger.recent(),
                "uncommitted": ledger.uncommitted(),
            }
        }
        await asyncio.to_thread(self._save_checkpoint, extra)
        ledger.checkpointed()
        self._since_checkpoint = 0

    def _export(self) -> Exported:
        keep = self.settings.weights.keep_versions
        if self.ranks is None:
            return self.trainer.export(keep)
        return self.ranks.export(self.trainer, keep)

    def _save_checkpoint(self, extra: dict[str, Any]) -> None:
        if self.ranks is None:
            self.trainer.save_checkpoint(extra)
        else:
            self.ranks.save_checkpoint(self.trainer, extra)

    async def _commit(self, *, all_closed: bool) -> None:
        intervals, ids = self._ledger.committable(all_closed=all_closed)
        if not intervals:
            return
        commit = BatchCommit(
            id=uuid.uuid4().hex,
            rollout_ids=ids,
            learner=self.instance,
            through_step=self.trainer.step,
        )
        reply = await self._commit_request(commit)
        if reply is None:
            self.commit_failures += 1
            return  # kept: the next checkpoint commits these too
        self.commits += 1
        self._ledger.committed(intervals, ids, through_step=self.trainer.step)
        if reply.unknown:
            self.log.info("commit_unknown", rollouts=reply.unknown, committed=reply.committed)

    async def _commit_request(self, request: BatchCommit | LeaseRelease) -> CommitReply | None:
        try:
            timeout_s = self.settings.commits.commit_timeout_s
            return await ReplayClient(self.bus).commit(request, timeout_s)
        except Refused as error:
            self.log.warning("commit_refused", code=error.code, reason=error.message)
            return None
        except AskError as error:
            self.log.warning("commit_failed", kind=type(request).__name__, error=repr(error))
            return None

    async def _report_progress(self) -> None:
        """After a batch that changed no weight: the same version, with what was consumed,
        so generators pacing their admission by it are not left waiting."""
        current = self._exported
        if current is None or current.version != self.trainer.version:
            current = await asyncio.to_thread(self.trainer.current_weights)
        if current is None:
            current = await asyncio.to_thread(self._export)
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
            settled_samples=trainer.settled,
        )
        if self.weights is not None:
            update = await self.weights.offer(exported, update)
        msg_id = f"policy-{exported.version}-{exported.digest}-{trainer.settled}"
        await self._publish_patiently(subjects.policy_update(), update, msg_id)
        if self.weights is not None:
            self.weights.announced(exported.version)
        self._exported = exported
        self.acks.announced(exported.version)
        self.log.info("policy_published", version=exported.version, step=self.trainer.step)

    async def _publish_patiently(self, subject: str, update: PolicyUpdate, msg_id: str) -> None:
        """Publish, again while the stream does not answer: a NATS cluster electing a new
        stream leader (4-9 s) must not end the learner.  The msg id makes a repeat of a
        publication that was stored after all a no-op."""
        deadline = time.monotonic() + ANNOUNCE_PATIENCE_S
        while True:
            try:
                await self.bus.publish(subject, update, msg_id=msg_id)
                return
            except (nats.errors.Error, TimeoutError) as error:
                if time.monotonic() > deadline:
                    raise
                self.log.warning("policy_publish_retry", version=update.version, error=repr(error))
                await asyncio.sleep(0.5)

    async def teardown(self) -> None:
        if self._current is not None:
            await asyncio.wait([self._current])
        # After a step that failed part-way (a rank died) the weights may hold part of it.
        broken = self.ranks is not None and self.ranks.broken
        if self._trainer is not None and self._since_checkpoint and not broken:
            await self._checkpoint()
        if self._trainer is not None:
            await self._commit(all_closed=True)
        if self._scalars is not None:
            self._scalars.close()
        if self.weights is not None:
            await self.weights.close()

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
        values["served_again"] = float(self.served_again)
        values["commits"] = float(self.commits)
        values["commit_failures"] = float(self.commit_failures)
        values["negative_staleness"] = float(self.negative_staleness)
        values["uncommitted"] = float(self._ledger.waiting(all_intervals=True))
        values.update(self.acks.statistics())
        values["world_size"] = float(self.ranks.world_size if self.ranks is not None else 1)
        if self.weights is not None:
            values.update(self.weights.statistics())
        if self._trainer is not None:
            values["step"] = float(self._trainer.step)
            values["policy_version"] = float(self._trainer.version)
        last = self.last
        if last is not None:
            values["reward_mean"] = last.reward_mean
            values["staleness_mean"] = last.staleness_mean
            # The trainer's stages of the step (rows, no-grad passes, updates), not the wait
            # for the batch nor the publish.
            values["step_s"] = sum(last.seconds.values())
            values["clip_fraction"] = last.loss.clip_fraction
            values["approx_kl"] = last.loss.approx_kl
            values["entropy"] = last.loss.entropy
            values["diversity"] = last.diversity
            if last.logprob_mismatch_tokens:
                values["logprob_mismatch"] = last.logprob_mismatch
            for domain, reward in last.reward_by_domain.items():
                values[f"reward.{domain}"] = reward
        return values


def _behaviour_version(item: ScoredRollout) -> int | None:
    versions = [s.version for s in item.rollout.segments if s.version is not None]
    return max(versions) if versions else None
