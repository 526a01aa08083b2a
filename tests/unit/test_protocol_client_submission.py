"""How the client follows a submission's results with one consumer: filters, start, tally."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from protocol import streams, subjects
from protocol.client.link import Start
from protocol.client.submission import (
    CLOCK_SLACK_S,
    TASK_FILTERS_MAX,
    Receipt,
    Submission,
    Tally,
    follow_plan,
)
from protocol.messages import ChatMessage, Rollout, ScoredRollout, Task, rollout_id

PROMPT = [ChatMessage(role="user", content="x")]


def task(task_id: str, domain: str = "math", **fields: object) -> Task:
    return Task(id=task_id, domain=domain, prompt=PROMPT, **fields)  # type: ignore[arg-type]


def submission(
    tasks: list[Task], *, duplicates: int = 0, stream: str = "TEMPER_TASKS_1"
) -> Submission:
    receipts = tuple(
        Receipt(t.id, "trace", stream, i + 1, duplicate=i < duplicates) for i, t in enumerate(tasks)
    )
    return Submission(tuple(tasks), receipts, scored_seq=41, started_at=1_000_000.0)


def result(of: Task, sample: int, *, attempt: int | None = None) -> ScoredRollout:
    if attempt is not None:
        of = msgspec.structs.replace(of, attempt=attempt)
    ident = rollout_id(of.id, sample, of.attempt)
    rollout = Rollout(id=ident, task=of, sample_index=sample)
    return ScoredRollout(id=ident, rollout=rollout, reward=1.0)


def test_a_small_submission_filters_on_its_tasks_and_reads_what_is_stored() -> None:
    tasks = [task("a"), task("b", "code"), task("a")]
    plan = follow_plan(submission(tasks))
    assert plan.filters == (subjects.scored_for_task("a"), subjects.scored_for_task("b"))
    assert plan.start == Start()


def test_a_large_submission_filters_on_its_domains_after_the_mark() -> None:
    tasks = [task(f"t{i}", "math" if i % 2 else "code") for i in range(TASK_FILTERS_MAX + 1)]
    plan = follow_plan(submission(tasks))
    assert plan.filters == (subjects.scored_in_domain("code"), subjects.scored_in_domain("math"))
    assert plan.start == Start(seq=42)


def test_a_large_submission_with_duplicates_starts_a_duplicate_window_before() -> None:
    tasks = [task(f"t{i}") for i in range(TASK_FILTERS_MAX + 1)]
    plan = follow_plan(submission(tasks, duplicates=1))
    window = streams.BY_NAME["TEMPER_TASKS_1"].duplicate_window_s
    since = datetime.fromtimestamp(1_000_000.0 - window - CLOCK_SLACK_S, UTC)
    assert plan.start == Start(time=since)


def test_a_submission_across_very_many_domains_follows_the_whole_stream() -> None:
    tasks = [task(f"t{i}", f"d{i}") for i in range(TASK_FILTERS_MAX + 1)]
    assert follow_plan(submission(tasks)).filters == (subjects.scored_all(),)


def test_the_tally_counts_each_sample_once_and_knows_when_it_is_done() -> None:
    one, two = task("one", n=2), task("two")
    tally = Tally([one, two])
    assert (tally.expected, tally.done) == (3, False)
    assert tally.add(result(one, 0))
    assert not tally.add(result(one, 0))  # the same rollout scored twice
    assert tally.add(result(two, 0))
    assert tally.progress.tasks_done == 1
    assert not tally.done
    assert tally.add(result(one, 1))
    assert tally.done
    assert [r.id for r in tally.results()["one"]] == ["one/0", "one/1"]


def test_the_tally_takes_retries_but_not_earlier_attempts() -> None:
    again = task("r", n=2, attempt=1)
    tally = Tally([again])
    assert not tally.add(result(again, 0, attempt=0))  # the first submission's result
    assert tally.add(result(again, 0, attempt=1))
    assert tally.add(result(again, 1, attempt=2))  # a retry of a failed sample
    assert tally.done


def test_the_tally_ignores_other_tasks_and_reads_the_id_from_the_subject() -> None:
    mine = task("mine")
    tally = Tally([mine])
    assert tally.wants(subjects.scored("math", "mine"))
    assert not tally.wants(subjects.scored("math", "mine2"))
    assert not tally.add(result(task("other"), 0))
    assert tally.progress.scored == 0


@pytest.mark.parametrize(
    ("tasks", "expected"),
    [
        ([task("w", n=3)], "0 of 3 scored rollouts of task 'w' arrived within 0.5s"),
        (
            [task(f"m{i}") for i in range(7)],
            "7 of 7 tasks not fully scored within 0.5s (0 of 7 samples scored): 'm0' (1 missing), "
            "'m1' (1 missing), 'm2' (1 missing), 'm3' (1 missing), 'm4' (1 missing) and 2 more",
        ),
    ],
)
def test_a_shortfall_says_what_is_missing(tasks: list[Task], expected: str) -> None:
    assert Tally(tasks).shortfall(0.5) == expected
