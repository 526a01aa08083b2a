"""A submission of many tasks, and how its results are followed through one consumer.

One consumer per task does not scale: nats-server refuses consumers past its limit per
stream (1,000 on nats-server 2.15), and every client waiting shares that limit.  So a
submission is followed by one ordered consumer of ``TEMPER_SCORED``:

* up to :data:`TASK_FILTERS_MAX` tasks, filtered on the tasks' own subjects
  (``temper.v1.scored.*.<task_id>``), from the stream's first message: every stored
  result of a task counts, as with :meth:`TemperClient.wait_scored`;
* more, filtered on their domains (``temper.v1.scored.<domain>.*``), and the client keeps
  the submitted ids.  It starts after where the stream stood before the first publish: a
  result of a task stored by this submission comes later.  If the stream took a task as a
  duplicate (the same message id within its duplicate window), that task may have been
  scored already, and the consumer starts a duplicate window (plus a margin for clocks)
  before the submission instead.

The server's cost of making a consumer grows with the square of its filter subjects
(1,000 filters take it about a second), hence the bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from protocol import streams, subjects
from protocol.client.link import Start
from protocol.messages import ScoredRollout, Task

#: Most tasks a consumer filters by their own subjects.
TASK_FILTERS_MAX: Final = 256
#: How far the client's clock may be ahead of the server's when a consumer starts by time.
CLOCK_SLACK_S: Final = 60.0
#: The duplicate window of a stream that is not one of the stack's (as declared in streams.py).
_DEFAULT_WINDOW_S: Final = 600.0


@dataclass(frozen=True, slots=True)
class Receipt:
    """What JetStream acknowledged for one submitted task (not a wire message)."""

    task_id: str
    trace_id: str
    stream: str
    seq: int
    #: The stream already held this ``Nats-Msg-Id``: nothing new was stored.
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Submission:
    """Tasks as one call submitted them, with what following their results needs."""

    tasks: tuple[Task, ...]
    receipts: tuple[Receipt, ...]
    #: ``TEMPER_SCORED``'s last sequence before the first task was published.
    scored_seq: int
    #: Unix time before the first task was published (the client's clock).
    started_at: float

    @property
    def duplicates(self) -> int:
        """Tasks the stream already held (same message id within its duplicate window)."""
        return sum(receipt.duplicate for receipt in self.receipts)


@dataclass(frozen=True, slots=True)
class Progress:
    """How far the results of a submission are (not a wire message)."""

    #: Samples with a scored rollout, of those the tasks ask for.
    scored: int
    expected: int
    #: Tasks with a scored rollout for every sample.
    tasks_done: int
    tasks: int


@dataclass(frozen=True, slots=True)
class FollowPlan:
    """The one consumer that follows a submission: its filter subjects and start."""

    filters: tuple[str, ...]
    start: Start


def follow_plan(submission: Submission) -> FollowPlan:
    """How to follow ``submission``'s results with one consumer (see the module's text)."""
    ids = list(dict.fromkeys(task.id for task in submission.tasks))
    if len(ids) <= TASK_FILTERS_MAX:
        return FollowPlan(tuple(subjects.scored_for_task(i) for i in ids), Start())
    domains = sorted({task.domain for task in submission.tasks})
    if len(domains) <= TASK_FILTERS_MAX:
        filters = tuple(subjects.scored_in_domain(domain) for domain in domains)
    else:
        filters = (subjects.scored_all(),)
    if not submission.duplicates:
        return FollowPlan(filters, Start(seq=submission.scored_seq + 1))
    window = max(_window_s(r.stream) for r in submission.receipts if r.duplicate)
    since = submission.started_at - window - CLOCK_SLACK_S
    return FollowPlan(filters, Start(time=datetime.fromtimestamp(since, UTC)))


def _window_s(stream: str) -> float:
    spec = streams.BY_NAME.get(stream)
    return spec.duplicate_window_s if spec is not None else _DEFAULT_WINDOW_S


@dataclass(slots=True)
class _Wanted:
    attempt: int
    expected: int
    missing: set[int]
    results: list[ScoredRollout]


class Tally:
    """Which samples of a submission's tasks have a scored rollout yet.

    A result counts for a task when it is of the submitted ``attempt`` or a later one (a
    retry of failed samples counts the attempt up); an earlier attempt's results are not
    this submission's.  A rollout scored twice (same id) counts once.  A task submitted
    twice in one call is followed once, as first given.
    """

    def __init__(self, tasks: Iterable[Task]) -> None:
        self._wanted: dict[str, _Wanted] = {}
        for task in tasks:
            if task.id not in self._wanted:
                samples = set(task.sample_indices)
                self._wanted[task.id] = _Wanted(task.attempt, len(samples), samples, [])
        self._seen: set[str] = set()
        self.expected = sum(wanted.expected for wanted in self._wanted.values())
        self._scored = 0
        self._tasks_done = sum(not wanted.missing for wanted in self._wanted.values())

    def wants(self, subject: str) -> bool:
        """Whether a message on ``subject`` can be a result of these tasks (its last token
        is the task id), decided before decoding it."""
        return subject.rpartition(".")[2] in self._wanted

    def add(self, scored: ScoredRollout) -> bool:
        """Count ``scored``; True if it is a new result of one of these tasks."""
        task = scored.rollout.task
        wanted = self._wanted.get(task.id)
        if wanted is None or task.attempt < wanted.attempt or scored.id in self._seen:
            return False
        self._seen.add(scored.id)
        wanted.results.append(scored)
        index = scored.rollout.sample_index
        if index in wanted.missing:
            wanted.missing.discard(index)
            self._scored += 1
            self._tasks_done += not wanted.missing
        return True

    @property
    def done(self) -> bool:
        return self._tasks_done == len(self._wanted)

    @property
    def progress(self) -> Progress:
        return Progress(self._scored, self.expected, self._tasks_done, len(self._wanted))

    def results(self) -> dict[str, list[ScoredRollout]]:
        """Every task's results so far, by task id, in the order they arrived."""
        return {task_id: list(wanted.results) for task_id, wanted in self._wanted.items()}

    def shortfall(self, timeout_s: float, shown: int = 5) -> str:
        """What is still missing, in one line (for a timeout)."""
        short = [(i, w) for i, w in self._wanted.items() if w.missing]
        if len(short) == 1:
            [(task_id, wanted)] = short
            have = wanted.expected - len(wanted.missing)
            return (
                f"{have} of {wanted.expected} scored rollouts of task {task_id!r} "
                f"arrived within {timeout_s:g}s"
            )
        names = ", ".join(f"{i!r} ({len(w.missing)} missing)" for i, w in short[:shown])
        more = f" and {len(short) - shown} more" if len(short) > shown else ""
        return (
            f"{len(short)} of {len(self._wanted)} tasks not fully scored within {timeout_s:g}s "
            f"({self._scored} of {self.expected} samples scored): {names}{more}"
        )
