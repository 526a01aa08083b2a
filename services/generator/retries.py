"""Retries of failed samples: a new attempt of the task for the samples whose failure the
domain's policy retries (services.domains.retry).

The retry is a task like any other, published to the same tier subject with
``attempt + 1``, only the failed sample indices in ``samples`` and ``not_before`` set to
the backoff.  Its rollout ids include the attempt, so JetStream's dedup window and the
replay buffer's memory never swallow it, and they keep the task id, so they join the
GRPO group that the first attempt's good samples are waiting in.  The task message's id
names the task, attempt and samples: a redelivery of the failed attempt publishes the
same retry once (:func:`requeue_msg_id`).  Samples whose attempts are used up are
published as they failed (the group and the statistics count them) and their task goes
to the dead-letter stream, from which ``temper dlq retry`` starts a new attempt.

A preempted task's suspended samples are re-queued the same way (:func:`resumed`), at
the same attempt, with their saved state.  A retried sample goes on from its last good
state: its checkpoint (the last turn boundary, when the domain's policy has
``resume``), else the state a preemption saved, else the prompt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from protocol.messages import Rollout, RolloutStatus, SavedTrajectory, Task
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


def plan(
    task: Task,
    rollouts: list[Rollout],
    policy: RetryPolicy,
    now: float,
    checkpoints: Mapping[int, SavedTrajectory] | None = None,
) -> RetryPlan:
    failed = [r for r in rollouts if r.status is RolloutStatus.INFRA_FAILURE]
    again = [r for r in failed if policy.retries(r.failure, task.attempt)]
    going = {r.id for r in again}
    given_up = [r for r in failed if r.failure in policy.on and r.id not in going]
    publish = [r for r in rollouts if r.id not in going]
    retry = exhausted = None
    if again:
        attempt = task.attempt + 1
        retry = _subset(task, again, attempt=attempt, not_before=now + policy.backoff(attempt))
        retry = _from_checkpoints(retry, checkpoints or {})
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


def requeue_msg_id(task: Task) -> str:
    """The message id of a retry or of the rest of a preempted task: a redelivery of the
    task it came from publishes it once.  Attempt, preemption count and sample set
    together tell apart every task re-queued from one submission (their sample sets are
    disjoint within an attempt)."""
    samples = ".".join(map(str, task.sample_indices))
    if len(samples) > 64:
        samples = hashlib.sha256(samples.encode()).hexdigest()[:32]
    return f"{task.id}@{task.attempt}~{task.preemptions}:{samples}"


def resumed(task: Task, saved: list[SavedTrajectory]) -> Task:
    """The rest of a preempted task: its suspended samples, each with its saved state."""
    return msgspec.structs.replace(
        task,
        samples=sorted(s.sample_index for s in saved),
        resume=saved,
        preemptions=task.preemptions + 1,
        not_before=None,
    )


def handed_back(task: Task) -> Task:
    """A task preempted while parked at admission, as it came: only counted (its
    message id changes with the count, so the stream takes it again)."""
    return msgspec.structs.replace(task, preemptions=task.preemptions + 1, not_before=None)


def _from_checkpoints(task: Task, checkpoints: Mapping[int, SavedTrajectory]) -> Task:
    """Samples with a checkpoint (their last turn boundary) go on from it."""
    saved = {s.sample_index: s for s in task.resume}
    saved.update((i, c) for i, c in checkpoints.items() if i in task.sample_indices)
    return msgspec.structs.replace(task, resume=[saved[i] for i in sorted(saved)])


def _subset(task: Task, rollouts: list[Rollout], *, attempt: int, not_before: float | None) -> Task:
    """The task of some samples; a sample saved by an earlier preemption goes on from
    there (its last good state), the others start afresh."""
    indices = sorted(r.sample_index for r in rollouts)
    saved = [s for s in task.resume if s.sample_index in indices]
    return msgspec.structs.replace(
        task, attempt=attempt, samples=indices, not_before=not_before, resume=saved
    )
