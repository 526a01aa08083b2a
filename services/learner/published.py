"""Resuming from weights published after the newest checkpoint.

A learner killed between checkpoints leaves versions newer than its checkpoint: their
weights on disk (``weights/v<N>``) and their steps in the ledger, each with the digest
of what it published.  Those steps are as durable as the checkpoint: the weights are
what they trained, and the ledger says on which rollouts.  Resuming from the newest of
them whose directory still matches its digest keeps that work instead of training it
again; its rollouts are then committed like the checkpoint's.  The optimizer's moments
and the RNG come from the checkpoint: the one part such a resume does not restore
exactly, which is why the learner checkpoints at once after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from services.learner.ledger import Line, read
from services.model.weights import directory_digest


@dataclass(frozen=True, kw_only=True)
class Published:
    version: int
    step: int
    path: Path
    #: Ledger offset just after the step record that published it.
    position: int
    #: Rollouts trained by the steps after the checkpoint up to this one.
    trained: list[str] = field(default_factory=list)
    #: Those, and the ones served again meanwhile: all to commit.
    commit: list[str] = field(default_factory=list)


def newest_published(
    ledger: Path, position: int, weights: Path, after_version: int
) -> Published | None:
    """The newest version past ``after_version`` published by a step recorded after
    ``position`` in ``ledger``, whose directory under ``weights`` matches its digest."""
    steps = _surviving_steps(ledger, position)
    for index in range(len(steps) - 1, -1, -1):
        record = steps[index].record
        if not record.get("published") or int(record["version"]) <= after_version:
            continue
        path = weights / f"v{int(record['version'])}"
        if path.is_dir() and directory_digest(path) == record.get("digest"):
            return _published(steps[: index + 1], path)
    return None


def _published(steps: list[Line], path: Path) -> Published:
    last = steps[-1]
    trained = [r["id"] for s in steps for r in s.record.get("rollouts", [])]
    again = [i for s in steps for i in s.record.get("again", [])]
    return Published(
        version=int(last.record["version"]),
        step=int(last.record["step"]),
        path=path,
        position=last.end,
        trained=trained,
        commit=trained + again,
    )


def _surviving_steps(ledger: Path, position: int) -> list[Line]:
    """Step records after ``position`` that no later resume abandoned."""
    steps: list[Line] = []
    for line in read(ledger, position):
        kind = line.record.get("kind")
        if kind == "step":
            steps.append(line)
        elif kind == "resume":
            steps = [s for s in steps if s.start < int(line.record["position"])]
    return steps
