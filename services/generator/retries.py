"""Retries of failed samples: a new attempt of the task for the samples whose failure the
domain's policy retries (services.domains.retry).

The retry is a task like any other, published to the same tier subject with
``attempt + 1``, only the failed sample indices in ``samples`` and ``not_before`` set to
the backoff.  Its rollout ids include the attempt, so JetStream's dedup window and the
replay buffer's memory never swallow it, and they keep the task id, so they join the
GRPO group that the first attempt's good samples are waiting in.  The task message's id
is ``<task id>@<attempt>``: a redelivery of the failed attempt publishes the same retry
once.  Samples whose attempts are used up are published as they failed (the group and
the statistics count them) and their task goes to the dead-letter stream, from which
``temper dlq retry`` starts a new attempt.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from protocol.messages import Rollout, RolloutStatus, Task
from services.domains.retry import RetryPolicy


@dataclass(frozen=True, kw_only=True)
class RetryPlan:
    #: Stored now: every rollout but those that go again.
    publish: list[Rollout]
    #: The next attempt of the samples that go again.
    retry: Task | None = None
    #: The task of the samples that failed on their last attempt (for the dead letter).
    exhausted: Task | None = None
    #: Why those failed, from the first such rollout.
    reason: str = ""


def plan(task: Task, rollouts: list[Rollout], policy: RetryPolicy, now: float) -> RetryPlan:
    failed = [r for r in rollouts if r.status is RolloutStatus.INFRA_FAILURE]
    again = [r for r in failed if policy.retries(r.failure, task.attempt)]
    going = {r.id for r in again}
    given_up = [r for r in failed if r.failure in policy.on and r.id not in going]
    publish = [r for r in rollouts if r.id not in going]
    retry = exhausted = None
    if again:
        attempt = task.attempt + 1
        retry = _subset(task, again, attempt=attempt, not_before=now + policy.backoff(attempt))
    if given_up:
        exhausted = _subset(task, given_up, attempt=task.attempt, not_before=None)
    reason = ""
    if given_up:
        first = given_up[0]
        reason = (
            f"{len(given_up)} sample(s) failed on attempt {task.attempt + 1} of "
            f"{policy.max_attempts} ({first.failure}): {first.error or 'no detail'}"
        )
    return RetryPlan(publish=publish, retry=retry, exhausted=exhausted, reason=reason)


def retry_msg_id(task: Task) -> str:
    return f"{task.id}@{task.attempt}"


def _subset(task: Task, rollouts: list[Rollout], *, attempt: int, not_before: float | None) -> Task:
    indices = sorted(r.sample_index for r in rollouts)
    return msgspec.structs.replace(task, attempt=attempt, samples=indices, not_before=not_before)
