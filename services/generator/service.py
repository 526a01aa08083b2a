"""Generator service: tasks from the tier streams in, rollouts out, weights kept current.

Tasks are pulled with strict priority (tier 0 first) under one shared concurrency bound,
and within a tier in weighted fair share between domains and between the tenants of
each, a quarantined domain's tasks held in their stream (services.generator.scheduling.intake,
services.generator.scheduling.scheduler); the validator's infrastructure failures of this
instance's rollouts, heard on the scored subject, count toward that quarantine.
A task is acked only once all its rollouts are stored in the rollout stream, each with
its stable id as ``Nats-Msg-Id``, so a redelivered task republishes nothing new.
Policy updates are applied by the engine's weight transaction between requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import nats.js.errors

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.errors import ProtocolError
from protocol.messages import (
    CallCancel,
    DomainControl,
    DomainSchedules,
    PolicyUpdate,
    ScoredRollout,
    Stats,
    Task,
    WeightFormat,
    WeightSyncAck,
    rollout_id,
)
from services.domains.api import is_heldout
from services.domains.retry import RetryPolicy
from services.engines.engine import Engine, EngineError
from services.generator.agent import AgentLoop, Outcome
from services.generator.cancels import CallCancels
from services.generator.making import batching_of, context_len, known_domains, make_engine
from services.generator.outcomes import Outcomes, RetryPolicies
from services.generator.scheduling.admission import StalenessAdmission
from services.generator.scheduling.fairshare import Flow
from services.generator.scheduling.intake import DURABLE, DomainConsumer
from services.generator.scheduling.preemption import Preemption, Running
from services.generator.scheduling.sandbox_admission import SandboxAdmission
from services.generator.scheduling.scheduler import DomainScheduler
from services.generator.settings import GeneratorSettings
from services.generator.tools import LocalTools, SandboxTools, ToolBox
from services.generator.trajectory import LoopLimits
from services.generator.weight_receiver import BroadcastEngine, WeightReceiver
from services.model.tokens import ChatTokenizer
from services.model.weights import verify_digest
from services.runtime.consumer import ConsumerTuning, Delivery
from services.runtime.errors import Defer, Reject
from services.runtime.jetstream import ConsumerSpec
from services.runtime.policy import last_policy_update
from services.runtime.priority import PriorityGate
from services.runtime.responder import Request
from services.runtime.service import Service
from services.runtime.stages import Stages

#: After a reconnect, how long to wait for JetStream to answer again (a restarted server
#: recovers its streams first) before the catch-up reads the policy stream anyway.
JETSTREAM_READY_S = 10.0


class GeneratorService(Service):
    name = "generator"

    def __init__(self, settings: GeneratorSettings, engine: Engine | None = None) -> None:
        super().__init__(settings.runtime)
        self.settings = settings
        self._engine = engine
        self._loop: AgentLoop | None = None
        self._known: Callable[[str], bool] | None = None
        #: Fair share between domains and quarantine, shared by every tier's intake.
        self.scheduler = DomainScheduler(settings.scheduling, {})
        self._weights_lock = asyncio.Lock()
        self.version = 0
        self.latest_announced = 0
        #: Suspended samples taken up again.
        self.resumed = 0
        self._gate = PriorityGate(len(streams.TASK_STREAMS), settings.max_concurrent_tasks)
        self.preemption = Preemption(
            self._gate, self._stream_depth, check_s=settings.preempt_check_s, on=settings.preemption
        )
        self.weight_failures = 0
        #: ``torch_distributed`` updates whose broadcast failed (loaded from disk, or not).
        self.broadcast_failures = 0
        self._receiver: WeightReceiver | None = None
        self._generated_at_start = 0
        self._task_codec: Codec[Task] = Codec(Task)
        self.admission = StalenessAdmission(settings.admission_samples)
        self.sandbox_admission = SandboxAdmission(settings.sandbox_report_stale_s)
        #: Per task: waiting for admission, generating, publishing; per update: reloading.
        self.stages = Stages()
        #: Where each task's samples went: published, retried, re-queued, dead-lettered.
        self.outcomes = Outcomes(self.stages, self.log)
        #: Gateway calls whose callers went away.
        self.cancels = CallCancels()

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("generator engine not created (service not started)")
        return self._engine

    async def setup(self) -> None:
        settings = self.settings
        if self._engine is None:
            self._engine = make_engine(settings)
        await self.engine.start()
        self.version = self.engine.statistics().version
        if isinstance(self.engine, BroadcastEngine):
            self._receiver = WeightReceiver(
                self.bus.nc,
                self.engine,
                self.instance,
                self.log,
                request_timeout_s=settings.weight_request_timeout_s,
            )
        tokenizer = await asyncio.to_thread(ChatTokenizer.load, settings.model)
        self._loop = AgentLoop(
            self.engine,
            tokenizer,
            self._toolbox(),
            LoopLimits(
                context_len=context_len(settings.model),
                max_total_tokens=settings.max_total_tokens,
                turn_timeout_s=settings.turn_timeout_s,
            ),
            generator=self.instance,
        )
        self._known, weights, policies = await asyncio.to_thread(known_domains, settings)
        default = RetryPolicy(
            max_attempts=settings.retry_max_attempts, backoff_s=settings.retry_backoff_s
        )
        self.outcomes.connect(self.bus, self.dead_letters, RetryPolicies(policies, default))
        self.scheduler = DomainScheduler(settings.scheduling, weights)
        # A tier with work waiting for the turn cuts short an idle tier's poll.
        publishes = self.scheduler.fairness.publishes
        publishes.waiting = self._gate.is_waiting
        self._gate.on_busy_wait = publishes.wants_turn
        await self._catch_up_weights()
        self.listen(subjects.policy_update(), Codec(PolicyUpdate), self._on_policy)
        self.listen(subjects.domain_control(), Codec(DomainControl), self._on_domain_control)
        self.listen(subjects.gateway_cancel(), Codec(CallCancel), self._on_call_cancel)
        if settings.tools == "sandbox" and settings.sandbox_admission:
            self.listen(subjects.stats("sandbox"), Codec(Stats), self._on_sandbox_stats)
        if settings.scheduling.quarantine and settings.scheduling.quarantine_validator:
            # Every scored rollout, to find this instance's among them; the replay buffer
            # consumes (and dead-letters) the stream, so this one only watches.
            scored: Codec[ScoredRollout] = Codec(ScoredRollout)
            self.listen(subjects.scored_all(), scored, self._on_scored, observer=True)
        for tier, spec in enumerate(streams.TASK_STREAMS):
            consumer = DomainConsumer(
                self._consumer_spec(spec.name),
                self._task_codec,
                self._on_task,
                tier=tier,
                fairness=self.scheduler.fairness,
                **self._consumer_deps(self._tuning(tier)),
            )
            self._add_consumer(consumer)

    def _consumer_spec(self, stream: str) -> ConsumerSpec:
        return ConsumerSpec(
            stream=stream,
            durable=DURABLE,
            ack_wait_s=self.settings.ack_wait_s,
            max_deliver=self.settings.max_deliver,
        )

    def _tuning(self, tier: int) -> ConsumerTuning:
        return ConsumerTuning(
            max_in_flight=self.settings.max_concurrent_tasks,
            fetch_wait_s=self.settings.fetch_wait_s,
            gate=self._gate,
            tier=tier,
        )

    def _toolbox(self) -> ToolBox:
        if self.settings.tools == "sandbox":
            return SandboxTools(
                self.bus.nc,
                timeout_s=self.settings.tool_timeout_s,
                on_open=self.sandbox_admission.opened,
            )
        return LocalTools()

    async def intake_stopped(self) -> None:
        # Tasks parked at admission wait for a learner step that may never come now (the
        # learner stops first): hand them back at once rather than after the whole grace.
        self.preemption.stop()
        await self.intake_ended(self.runtime.grace_s)
        self.admission.close()
        self.sandbox_admission.close()

    async def teardown(self) -> None:
        if self._receiver is not None:
            await self._receiver.close()
        if self._engine is not None:
            await self._engine.close()

    # ------------------------------------------------------------------ tasks

    async def _on_task(self, task: Task, delivery: Delivery) -> None:
        route = _route_of(task, delivery)
        wait_s = (task.not_before or 0.0) - time.time()
        if wait_s > 0:
            raise Defer(wait_s, "retry backoff")
        outcome = Outcome(rollouts=[])
        flow = Flow(task.domain, task.tenant)
        self.scheduler.started(flow)
        running = self.preemption.started(id(delivery), task, route.tier)
        try:
            outcome = await self._generate_or_cancel(task, running)
            self.scheduler.generated(task.domain, outcome.rollouts)
            await self.outcomes.settle(task, outcome, delivery)
        finally:
            self.preemption.finished(id(delivery))
            self.scheduler.finished(flow)
        self.log.info(
            "task_generated",
            domain=task.domain,
            tenant=task.tenant,
            samples=len(outcome.rollouts),
            suspended=len(outcome.suspended),
            statuses=sorted({r.status.value for r in outcome.rollouts}),
        )

    async def _generate_or_cancel(self, task: Task, running: Running) -> Outcome:
        """A gateway call runs until its caller cancels it (``CallCancel``)."""
        if task.call is None:
            return await self._generate(task, running)
        outcome = await self.cancels.run(task.id, self._generate(task, running))
        return outcome if outcome is not None else Outcome(rollouts=[], cancelled=True)

    async def _on_call_cancel(self, message: CallCancel, _: Request) -> None:
        self.cancels.cancel(message)

    async def _generate(self, task: Task, running: Running) -> Outcome:
        samples, reserve = _admitted_samples(task)
        if samples:
            with self.stages.stage("admission"):
                admitted = self.admission.admit(samples, reserve=reserve)
                if not await running.unless_asked(admitted):
                    return Outcome(rollouts=[], handed_back=True)
            samples = samples if reserve else 0
        if not task.tools or self.settings.tools != "sandbox":
            with self.stages.stage("generate"):
                return await self._rollouts_for(task, running)
        # One sandbox session per trajectory: each of the task's samples needs one.
        trajectories = [rollout_id(task.id, i, task.attempt) for i in task.sample_indices]
        with self.stages.stage("sandbox_admission"):
            if not await running.unless_asked(self.sandbox_admission.admit(trajectories)):
                self.admission.release(samples)
                return Outcome(rollouts=[], handed_back=True)
        try:
            with self.stages.stage("generate"):
                return await self._rollouts_for(task, running)
        finally:
            self.sandbox_admission.finished(trajectories)

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [self.preemption.run()]

    async def _stream_depth(self, tier: int) -> int:
        """Tasks in a tier's stream (waiting or in flight anywhere)."""
        try:
            info = await self.bus.js.stream_info(streams.TASK_STREAMS[tier].name)
        except (nats.errors.Error, TimeoutError):
            return 0  # unknown now: nobody is asked to yield on a guess
        return int(info.state.messages)

    async def _on_sandbox_stats(self, stats: Stats, _: Request) -> None:
        self.sandbox_admission.report(stats.instance, stats.values)

    async def _on_scored(self, scored: ScoredRollout, _: Request) -> None:
        if self.scheduler.judged(scored, self.instance):
            self.log.info(
                "validator_infra_failure",
                domain=scored.rollout.task.domain,
                rollout=scored.rollout.id,
                error=scored.error,
            )

    async def _on_domain_control(self, request: DomainControl, _: Request) -> DomainSchedules:
        answer = self.scheduler.control(request, self.instance)
        if answer.applied:
            self.log.info(
                "domain_control",
                domain=request.domain,
                resume=request.resume,
                share_weight=request.share_weight,
            )
        return answer

    async def _rollouts_for(self, task: Task, running: Running) -> Outcome:
        loop = self._loop
        assert loop is not None
        # A gateway call is not scored by its domain's validators when generated: the
        # domain only schedules it (its tenant's share) until its session is rewarded.
        if task.call is None and self._known is not None and not self._known(task.domain):
            return Outcome(rollouts=loop.refuse(task, f"unknown domain {task.domain!r}"))
        if task.deadline is not None and task.deadline < time.time():
            reason = "the task's deadline passed before it was generated"
            return Outcome(rollouts=loop.refuse(task, reason))
        checkpoints = self.outcomes.checkpoints(task)
        outcome = await loop.run_until(task, running.should_yield, checkpoints=checkpoints)
        if task.resume:
            self.resumed += len(task.resume)
            self.stages.add("preempt_restore", outcome.restore_s)
        return outcome

    # ------------------------------------------------------------------ weights

    async def _catch_up_weights(self) -> None:
        """A generator that starts late serves the newest announced policy from the start."""
        update = await last_policy_update(self.bus.js, self.log)
        if update is not None:
            await self._apply(update)

    async def reconnected(self) -> None:
        """Updates announced while disconnected were missed: serve the newest one at once,
        not only once the next one comes."""
        await self._jetstream_ready(JETSTREAM_READY_S)
        await self._catch_up_weights()

    async def _jetstream_ready(self, bound_s: float) -> None:
        deadline = time.monotonic() + bound_s
        while True:
            try:
                await self.bus.js.stream_info(streams.POLICY.name)
                return
            except nats.js.errors.NotFoundError:
                return  # JetStream answers; nothing was ever announced
            except (nats.errors.Error, TimeoutError) as error:
                if time.monotonic() >= deadline:
                    self.log.warning("policy_stream_unavailable", error=repr(error))
                    return
                await asyncio.sleep(0.1)

    async def _on_policy(self, update: PolicyUpdate, _: Request) -> None:
        await self._apply(update)

    async def _apply(self, update: PolicyUpdate) -> None:
        self.latest_announced = max(self.latest_announced, update.version)
        try:
            async with self._weights_lock:
                if update.version > self.version:
                    await self._swap(update)
        finally:
            # Room for new work only once the new weights serve, so that work starts on
            # them: with one batch of room this makes the loop synchronous (on-policy).
            self.admission.learner_trained(settled_samples(update))

    async def _swap(self, update: PolicyUpdate) -> None:
        started = time.monotonic()
        error = await self._load(update)
        elapsed = time.monotonic() - started
        self.stages.add("weight_reload", elapsed)
        ack = WeightSyncAck(
            # The learner may have sent a newer announced version than asked for.
            version=self.version if error is None else update.version,
            service=self.name,
            instance=self.instance,
            ok=error is None,
            error=error,
            duration_s=elapsed,
        )
        await self.bus.emit(subjects.weight_ack(self.name), ack)

    async def _load(self, update: PolicyUpdate) -> str | None:
        try:
            async with asyncio.timeout(self.settings.weight_update_timeout_s):
                served = await self._fetch(update)
        except (EngineError, OSError, ValueError, TimeoutError) as error:
            self.weight_failures += 1
            self.log.error("weight_update_failed", version=update.version, error=str(error))
            return f"{type(error).__name__}: {error}"
        self.version = served
        self.log.info("weights_updated", version=served, uri=update.uri)
        return None

    async def _fetch(self, update: PolicyUpdate) -> int:
        """Load ``update``; return the version served (newer if the learner sent one)."""
        if update.format is WeightFormat.TORCH_DISTRIBUTED:
            return await self._receive(update)
        await asyncio.to_thread(verify_digest, Path(update.uri), update.digest)
        await self.engine.load_weights(update.version, update.uri)
        return update.version

    async def _receive(self, update: PolicyUpdate) -> int:
        """A broadcast update: received by the servers, else loaded from its directory
        (``update.path``) by an engine that cannot receive one, or after a failed broadcast
        when ``weight_disk_fallback`` allows it."""
        receiver = self._receiver
        if receiver is not None:
            try:
                return await receiver.load(update)
            except EngineError as error:
                self.broadcast_failures += 1
                if not (self.settings.weight_disk_fallback and update.path):
                    raise
                self.log.warning(
                    "weight_broadcast_failed", version=update.version, error=str(error)
                )
        elif not update.path:
            raise EngineError(
                f"the {self.engine.name} engine cannot receive a torch.distributed broadcast "
                "and the update names no directory"
            )
        disk = msgspec.structs.replace(update, format=WeightFormat.HF_SAFETENSORS, uri=update.path)
        return await self._fetch(disk)

    # ------------------------------------------------------------------ reporting

    def served_policy_version(self) -> int:
        return self.version

    def health(self) -> tuple[bool, str]:
        ok, detail = super().health()
        held = self.scheduler.held()
        quarantined = f" quarantined={','.join(held)}" if held else ""
        busy = self.scheduler.in_flight()
        in_flight = f" in_flight={busy}" if busy else ""
        return ok, detail or (
            f"engine={self.settings.engine} version={self.version}{in_flight}{quarantined}"
        )

    def statistics(self) -> dict[str, float]:
        values = super().statistics()
        stats = self.engine.statistics() if self._engine is not None else None
        if stats is not None:
            uptime = max(values.get("uptime_s", 0.0), 1e-9)
            values["tokens_per_s"] = stats.generated_tokens / uptime
            values["generated_tokens"] = float(stats.generated_tokens)
            values["cache_hit_ratio"] = stats.cache_hit_ratio
            values.update(batching_of(self.engine))
        values["policy_version"] = float(self.version)
        values["version_lag"] = float(max(0, self.latest_announced - self.version))
        values["weight_update_failures"] = float(self.weight_failures)
        values["weight_broadcast_failures"] = float(self.broadcast_failures)
        values["admission_ahead"] = float(self.admission.ahead())
        values["admission_waits"] = float(self.admission.waits)
        values["sandbox_admission_waits"] = float(self.sandbox_admission.waits)
        values["resumes"] = float(self.resumed)
        values.update(self.outcomes.statistics())
        values.update(self.cancels.statistics())
        values.update(self.scheduler.statistics())
        values.update(self.stages.figures())
        return values


def settled_samples(update: PolicyUpdate) -> int:
    """What the learner's update says will never come back to be trained: trained, or
    dropped untrained by the buffer (a learner that predates the count reports none)."""
    return max(update.trained_samples, update.settled_samples)


def _admitted_samples(task: Task) -> tuple[int, bool]:
    """The samples a task waits for at the staleness admission, and whether it reserves
    them there.  A held-out task is never trained on.  A gateway call waits for the
    trajectories it starts (one rollout each, however many calls they take) but reserves
    nothing: its session may never be rewarded, and a reservation never trained on would
    shrink the budget for good; once trained, the learner's count takes them in.  A
    resumed (preempted) or retried task's samples were reserved when it first started and
    are trained once: waiting or reserving again would count them twice, and over a run
    (245 preemptions in 15 minutes of the tool run) fill the budget for good, so that
    nothing starts again while the learner waits for a batch."""
    if is_heldout(task) or task.resume or task.attempt:
        return 0, True
    if task.call is not None:
        return min(task.call.new_samples, len(task.sample_indices)), False
    return len(task.sample_indices), True


def _route_of(task: Task, delivery: Delivery) -> subjects.TaskRoute:
    """The tier, domain and tenant of the subject a task came on.  The subject decided
    whose share the task was taken in, so a tenant of its own that differs is refused
    (dead-lettered): it would be counted, and its retries taken, as another's."""
    try:
        route = subjects.TaskRoute.parse(delivery.subject)
        route.check(task)
    except ProtocolError as error:
        raise Reject(error.code, error.message, field=error.field) from error
    return route
