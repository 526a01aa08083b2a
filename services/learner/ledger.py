"""The provenance ledger: which rollouts every learner step consumed, and what it made.

``ledger.jsonl`` in the learner's directory, append-only, one JSON record a line:

- ``step``: the step number, whether an update was applied and a version published,
  the policy version after it and its digest, the batch (request id), and per rollout
  its id, behaviour version and trace id.  Rollouts served again after they were
  trained are listed under ``again``: they are not trained twice, only committed.
- ``commit``: rollout ids the replay buffer acked for good (their steps are checkpointed).
- ``resume``: a learner started from a checkpoint taken at byte ``position``; step
  records after that position belong to an abandoned lineage (their batches were never
  committed, so the buffer serves them again).

The learner keeps the ids trained since its last checkpoint plus a bounded window of
older ones in memory, so a batch served again after a restart is recognised; the
checkpoint carries the same window and the ledger position.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILE = "ledger.jsonl"


@dataclass(frozen=True, kw_only=True)
class Consumed:
    rollout_id: str
    #: The behaviour policy version (newest segment's), None when the rollout has none.
    version: int | None
    trace_id: str = ""

    def record(self) -> dict[str, Any]:
        return {"id": self.rollout_id, "version": self.version, "trace": self.trace_id}


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    step: int
    applied: bool
    #: The step exported and announced a new version (``version``, ``digest``).
    published: bool
    version: int
    digest: str
    batch: str
    rollouts: list[Consumed]
    again: list[str] = field(default_factory=list)


class Ledger:
    def __init__(self, directory: Path, *, remember: int = 200_000) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / FILE
        self.remember = remember
        self._trained: OrderedDict[str, None] = OrderedDict()
        #: Ids trained (or served again) per checkpoint interval, oldest first; the
        #: last one is still open.
        self._segments: list[list[str]] = [[]]
        self._isolate_torn_tail()

    @property
    def position(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def trained(self, rollout_id: str) -> bool:
        return rollout_id in self._trained

    def resume(
        self,
        *,
        position: int,
        recent: list[str],
        uncommitted: list[str],
        step: int,
        version: int,
    ) -> None:
        """Continue the lineage of a checkpoint that was taken at ``position``.

        ``uncommitted``, trained before the checkpoint but not yet committed, is ready to
        commit at once: the checkpoint resumed from makes it durable, and committed now it
        is not served again only to be dropped as stale.
        """
        for rollout_id in recent:
            self._remember(rollout_id)
        self._segments = [list(uncommitted), []] if uncommitted else [[]]
        abandoned = max(0, self.position - position)
        if not self.position:
            return
        self._append(
            {
                "kind": "resume",
                "position": position,
                "step": step,
                "version": version,
                "abandoned_bytes": abandoned,
            }
        )

    def record_step(self, entry: StepRecord) -> None:
        for consumed in entry.rollouts:
            self._remember(consumed.rollout_id)
        self._segments[-1].extend(c.rollout_id for c in entry.rollouts)
        self._segments[-1].extend(entry.again)
        self._append(
            {
                "kind": "step",
                "step": entry.step,
                "applied": entry.applied,
                "published": entry.published,
                "version": entry.version,
                "digest": entry.digest,
                "batch": entry.batch,
                "rollouts": [c.record() for c in entry.rollouts],
                "again": entry.again,
            }
        )

    def checkpointed(self) -> None:
        """A checkpoint now covers everything recorded: close the open interval."""
        self._segments.append([])

    def committable(self, *, all_closed: bool = False) -> tuple[int, list[str]]:
        """(intervals, ids) ready to commit: those of every closed interval but the newest.

        Commits trail one checkpoint behind, so that a damaged newest checkpoint (the
        learner then resumes from the one before) loses no rollout that was acked.
        On a clean stop, ``all_closed`` commits the newest interval too.
        """
        closed = len(self._segments) - 1
        count = closed if all_closed else max(0, closed - 1)
        return count, [rollout_id for segment in self._segments[:count] for rollout_id in segment]

    def committed(self, intervals: int, ids: list[str], *, through_step: int) -> None:
        """The buffer acked the ids of the oldest ``intervals``: record the commit."""
        del self._segments[:intervals]
        if ids:
            self._append({"kind": "commit", "ids": ids, "through_step": through_step})

    def waiting(self, *, all_intervals: bool = False) -> int:
        """Rollouts not committed yet: of the open interval, or of every interval."""
        segments = self._segments if all_intervals else self._segments[-1:]
        return sum(len(segment) for segment in segments)

    def uncommitted(self) -> list[str]:
        """Every id trained (or served again) and not committed yet, oldest first."""
        return [rollout_id for segment in self._segments for rollout_id in segment]

    def recent(self) -> list[str]:
        return list(self._trained)

    def flush(self) -> None:
        """Make what was appended durable (before a commit acks it at the buffer)."""
        if self.path.exists():
            with self.path.open("ab") as out:
                os.fsync(out.fileno())

    def _remember(self, rollout_id: str) -> None:
        self._trained[rollout_id] = None
        self._trained.move_to_end(rollout_id)
        while len(self._trained) > self.remember:
            self._trained.popitem(last=False)

    def _append(self, record: dict[str, Any]) -> None:
        record["at"] = round(time.time(), 3)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record, separators=(",", ":")) + "\n")

    def _isolate_torn_tail(self) -> None:
        """A kill in the middle of an append leaves a partial last line: end it, so the
        next record starts on a line of its own (the checker counts it as torn)."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("rb+") as ledger:
            ledger.seek(-1, os.SEEK_END)
            if ledger.read(1) != b"\n":
                ledger.write(b"\n")


@dataclass(frozen=True, kw_only=True)
class Line:
    """One line of a ledger: its byte range and its record (empty for a torn line)."""

    start: int
    end: int
    record: dict[str, Any]


def read(path: Path, start: int = 0) -> Iterator[Line]:
    """The lines of the ledger at ``path`` that begin at or after byte ``start``."""
    if not path.is_file():
        return
    offset = 0
    with path.open("rb") as ledger:
        for raw in ledger:
            begin, offset = offset, offset + len(raw)
            if begin >= start:
                yield Line(start=begin, end=offset, record=_parse(raw))


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        record = json.loads(raw)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
