"""Retry planning alone: which failed samples go again, with which ids and backoff, and
what is given up; the domain config's ``retry`` table; ``temper dlq retry``'s next
attempt; the replay buffer keeping one sample per index across attempts."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from protocol.codec import Codec, encode
from protocol.messages import (
    ChatMessage,
    FailureKind,
    Rollout,
    RolloutStatus,
    ScoredRollout,
    Task,
    rollout_id,
)
from services.cli.dlq import next_attempt
from services.domains import load_registry
from services.domains.retry import RetryPolicy
from services.generator import retries
from services.replay.buffer import ReplayBuffer

TASK = Task(id="t", domain="d", prompt=[ChatMessage(role="user", content="q")], n=4)


def rollout(task: Task, index: int, failure: FailureKind | None = None) -> Rollout:
    status = RolloutStatus.OK if failure is None else RolloutStatus.INFRA_FAILURE
    return Rollout(
        id=rollout_id(task.id, index, task.attempt),
        task=task,
        sample_index=index,
        status=status,
        failure=failure,
        error=None if failure is None else f"{failure} broke",
    )


def test_only_failures_of_a_retried_kind_go_again_as_the_next_attempt() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_s=2.0, on=(FailureKind.TOOL, FailureKind.TIMEOUT))
    done = [
        rollout(TASK, 0),
        rollout(TASK, 1, FailureKind.TOOL),
        rollout(TASK, 2, FailureKind.ENGINE),
        rollout(TASK, 3, FailureKind.TIMEOUT),
    ]
    plan = retries.plan(TASK, done, policy, now=100.0)
    assert [r.sample_index for r in plan.publish] == [0, 2]
    assert plan.retry is not None and plan.exhausted is None
    assert (plan.retry.attempt, plan.retry.samples, plan.retry.not_before) == (1, [1, 3], 102.0)
    assert plan.retry.id == "t" and plan.retry.sample_indices == [1, 3]
    assert retries.requeue_msg_id(plan.retry) == "t@1~0:1.3"


def test_a_wrong_or_invalid_sample_never_goes_again() -> None:
    invalid = msgspec.structs.replace(rollout(TASK, 1), status=RolloutStatus.INVALID)
    plan = retries.plan(TASK, [rollout(TASK, 0), invalid], RetryPolicy(), now=0.0)
    assert len(plan.publish) == 2 and plan.retry is None and plan.exhausted is None


def test_the_last_attempt_publishes_the_failures_and_gives_their_task_up() -> None:
    last = msgspec.structs.replace(TASK, attempt=2, samples=[1, 2])
    done = [rollout(last, 1, FailureKind.TOOL), rollout(last, 2)]
    plan = retries.plan(last, done, RetryPolicy(max_attempts=3), now=0.0)
    assert [r.id for r in plan.publish] == ["t/1@2", "t/2@2"]
    assert plan.retry is None and plan.exhausted is not None
    assert (plan.exhausted.attempt, plan.exhausted.samples) == (2, [1])
    assert plan.reason.startswith("1 sample(s) failed on attempt 3 of 3 (tool): tool broke")


def test_backoff_doubles_up_to_its_bound() -> None:
    policy = RetryPolicy(backoff_s=1.5, backoff_max_s=5.0)
    assert [policy.backoff(k) for k in (1, 2, 3, 4, 60)] == [1.5, 3.0, 5.0, 5.0, 5.0]


def test_ids_name_the_attempt_from_the_first_retry_on() -> None:
    assert rollout_id("t", 3) == "t/3" and rollout_id("t", 3, 0) == "t/3"
    assert rollout_id("t", 3, 2) == "t/3@2"


@pytest.mark.parametrize(
    ("samples", "problem"), [([4], "not below n=4"), ([1, 1], "names an index twice")]
)
def test_a_task_refuses_sample_indices_outside_its_group(samples: list[int], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        msgspec.structs.replace(TASK, samples=samples).__post_init__()


def test_the_domain_config_sets_a_retry_policy(tmp_path: Path) -> None:
    path = tmp_path / "domains.toml"
    path.write_text(
        "[defaults]\nretry = { backoff_s = 0.5 }\n"
        '[[domain]]\nname = "x"\nkind = "arithmetic"\nretry = { max_attempts = 5, on = ["tool"] }\n'
        '[[domain]]\nname = "y"\nkind = "arithmetic"\n'
    )
    registry = load_registry(path, plugins=False)
    assert registry.get("x").retry == RetryPolicy(max_attempts=5, on=(FailureKind.TOOL,))
    assert registry.get("y").retry == RetryPolicy(backoff_s=0.5)


def test_dlq_retry_sends_a_task_back_as_its_next_attempt() -> None:
    dead = msgspec.structs.replace(TASK, attempt=2, samples=[1], not_before=5.0)
    again = Codec(Task).decode(next_attempt(encode(dead)))
    assert (again.attempt, again.samples, again.not_before) == (3, [1], None)
    assert next_attempt(b"\xc1 not msgpack") == b"\xc1 not msgpack"


def test_the_replay_buffer_keeps_one_sample_per_index_across_attempts() -> None:
    buffer = ReplayBuffer(group_timeout_s=60)
    two = msgspec.structs.replace(TASK, n=2)
    retry = msgspec.structs.replace(two, attempt=1, samples=[1])
    first, retried = rollout(two, 0), rollout(retry, 1)
    # A redelivered first attempt whose sample 1 came out well this time.
    late = rollout(two, 1)
    for item in (first, retried, late):
        buffer.add(ScoredRollout(id=item.id, rollout=item), lambda: None, now=0.0)
    selection = buffer.take(
        learner_version=0,
        max_staleness=4,
        max_samples=10,
        whole_groups=True,
        domain_weights={},
        now=1.0,
    )
    assert sorted(s.id for s in selection.items) == ["t/0", "t/1@1"]
    assert buffer.counts.duplicates == 1
