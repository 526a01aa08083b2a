"""Where a generated task's samples go: finished ones to the rollout stream, failed ones
that go again as their retry, suspended ones (preempted) re-queued with their state, and
the task of samples out of attempts to the dead-letter stream.  A gateway call's samples
go back to the gateway that asked, all of them at once.

Every publication carries a stable message id, so a redelivered task changes nothing
that was stored already (services.generator.retries).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from structlog.typing import FilteringBoundLogger

from protocol import subjects
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import CallResult, RolloutStatus, Task
from services.domains.retry import RetryPolicy
from services.generator import retries
from services.generator.agent import Outcome
from services.generator.scheduling.preemption import preemptible
from services.generator.trajectory import Trajectory
from services.runtime.bus import Bus
from services.runtime.consumer import Delivery
from services.runtime.deadletter import DeadLetters, Rejection
from services.runtime.stages import Stages


@dataclass(frozen=True)
class RetryPolicies:
    """Each domain's retry policy; ``default`` for domains the registry does not know."""

    by_domain: Mapping[str, RetryPolicy]
    default: RetryPolicy

    def of(self, domain: str) -> RetryPolicy:
        return self.by_domain.get(domain, self.default)


@dataclass(frozen=True)
class _Wiring:
    bus: Bus
    dead_letters: DeadLetters
    policies: RetryPolicies


class Outcomes:
    def __init__(self, stages: Stages, log: FilteringBoundLogger) -> None:
        self._stages = stages
        self._log = log
        self._wiring: _Wiring | None = None
        self.rollouts: Counter[str] = Counter()
        #: Samples of gateway calls answered, by status.
        self.calls: Counter[str] = Counter()
        #: Failed samples sent to a new attempt, and those dead-lettered after their last.
        self.retried = 0
        self.exhausted = 0
        #: Samples suspended by a preemption.
        self.preempted = 0
        #: Tasks handed back while parked at admission (preempted before they started).
        self.handed_back = 0

    def connect(self, bus: Bus, dead_letters: DeadLetters, policies: RetryPolicies) -> None:
        self._wiring = _Wiring(bus, dead_letters, policies)

    @property
    def wiring(self) -> _Wiring:
        if self._wiring is None:
            raise RuntimeError("outcomes not connected (service not started)")
        return self._wiring

    def checkpoints(self, task: Task) -> bool:
        """Whether the task's samples are saved at each turn boundary, to retry from."""
        policy = self.wiring.policies.of(task.domain)
        return policy.resume and policy.max_attempts > task.attempt + 1 and preemptible(task)

    async def settle(self, task: Task, outcome: Outcome, delivery: Delivery) -> None:
        """Store the rollouts, except failed samples that go again: their retry is
        published instead, as is the rest of a preempted task."""
        if outcome.handed_back:
            await self._again(retries.handed_back(task), delivery)
            self.handed_back += 1
            return
        if outcome.cancelled:
            return  # its caller is gone: the task is done with, and nobody waits for it
        if task.call is not None:
            await self._answer(task, task.call.reply, outcome, delivery)
            return
        wiring = self.wiring
        policy = wiring.policies.of(task.domain)
        plan = retries.plan(task, outcome.rollouts, policy, time.time(), outcome.checkpoints)
        trace_id = delivery.trace_id or None
        if outcome.suspended:
            await self._requeue(task, outcome.suspended, delivery)
        if task.tools:  # the tools' seconds of the task's samples
            self._stages.add("tool", sum(r.timings.tool_s for r in plan.publish))
        with self._stages.stage("publish"):
            for rollout in plan.publish:
                await wiring.bus.publish(
                    subjects.rollout(task.domain), rollout, trace_id=trace_id, msg_id=rollout.id
                )
                self.rollouts[rollout.status.value] += 1
            if plan.retry is not None:
                await self._again(plan.retry, delivery)
                self.retried += len(plan.retry.sample_indices)
            if plan.exhausted is not None:
                await self._give_up(plan.exhausted, plan.reason, delivery)

    async def _answer(self, task: Task, reply: str, outcome: Outcome, delivery: Delivery) -> None:
        """A gateway call's samples go back to its caller, failed ones included: the caller
        is waiting for them, and a retry would only answer after it gave up."""
        result = CallResult(task_id=task.id, rollouts=outcome.rollouts)
        with self._stages.stage("publish"):
            await self.wiring.bus.emit(reply, result, trace_id=delivery.trace_id or None)
        for rollout in outcome.rollouts:
            self.calls[rollout.status.value] += 1

    async def _again(self, task: Task, delivery: Delivery) -> None:
        # The subject it came on decides its tier, as it did for the first try; its tenant
        # is the task's (checked on delivery), so the task stays in its tenant's share.
        await self.wiring.bus.publish(
            delivery.subject,
            task,
            trace_id=delivery.trace_id or None,
            msg_id=retries.requeue_msg_id(task),
        )

    async def _requeue(self, task: Task, suspended: list[Trajectory], delivery: Delivery) -> None:
        """Re-queue a preempted task's suspended samples with their saved state."""
        await self._again(retries.resumed(task, [t.saved() for t in suspended]), delivery)
        self.preempted += len(suspended)
        self._stages.add("preempt_save", sum(t.save_s for t in suspended))

    async def _give_up(self, task: Task, reason: str, delivery: Delivery) -> None:
        """Dead-letter the task of samples that failed on their last attempt."""
        stream = delivery.msg.metadata.stream
        rejection = Rejection(
            code=ErrorCode.RETRIES_EXHAUSTED,
            message=reason,
            source=stream,
            subject=delivery.subject,
            deliveries=delivery.num_delivered,
            key=f"{stream}:{retries.requeue_msg_id(task)}",
        )
        self._log.warning("retries_exhausted", domain=task.domain, reason=reason)
        await self.wiring.dead_letters.reject(rejection, encode(task), dict(delivery.headers))
        self.exhausted += len(task.sample_indices)

    def statistics(self) -> dict[str, float]:
        values = {f"rollouts_{s.value}": float(self.rollouts[s.value]) for s in RolloutStatus}
        values.update(
            {f"call_samples_{s.value}": float(self.calls[s.value]) for s in RolloutStatus}
        )
        values["preemptions"] = float(self.preempted)
        values["preemptions_parked"] = float(self.handed_back)
        values["samples_retried"] = float(self.retried)
        values["samples_retries_exhausted"] = float(self.exhausted)
        return values
