"""Reads a provenance ledger back and says whether training was exactly-once.

The surviving lineage is every step record not abandoned by a later ``resume`` (whose
checkpoint was taken before it).  Over it:

- **trained twice**: a rollout id in two surviving steps;
- **uncommitted**: a rollout trained in the surviving lineage whose commit was never
  recorded (expected only for a learner still running, or killed at the end);
- **lost**: a rollout committed (acked at the buffer for good) whose only training step
  was abandoned: its data never reached the weights that survived;
- **versions**: the versions published by steps, in file order, must strictly increase,
  abandoned lineages included, since a number once published is never reused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.learner.ledger import FILE, read


@dataclass(kw_only=True)
class _Step:
    offset: int
    record: dict[str, Any]


@dataclass(kw_only=True)
class LedgerReport:
    path: Path
    steps: int = 0
    abandoned_steps: int = 0
    resumes: int = 0
    trained: int = 0
    committed: int = 0
    torn_lines: int = 0
    trained_twice: list[str] = field(default_factory=list)
    uncommitted: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    version_errors: list[str] = field(default_factory=list)
    trained_ids: set[str] = field(default_factory=set, repr=False)

    @property
    def ok(self) -> bool:
        return not (self.trained_twice or self.uncommitted or self.lost or self.version_errors)

    def summary(self) -> dict[str, Any]:
        return {
            "ledger": str(self.path),
            "ok": self.ok,
            "steps": self.steps,
            "abandoned_steps": self.abandoned_steps,
            "resumes": self.resumes,
            "trained_rollouts": self.trained,
            "committed_rollouts": self.committed,
            "torn_lines": self.torn_lines,
            "trained_twice": self.trained_twice,
            "uncommitted": self.uncommitted,
            "lost": self.lost,
            "version_errors": self.version_errors,
        }


def find_ledger(run_dir: Path) -> Path:
    """The ledger of a run directory (``temper train``'s or ``temper up``'s), or of a
    learner directory, or the file itself."""
    for candidate in (run_dir, run_dir / FILE, run_dir / "learner" / FILE):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no {FILE} in {run_dir} or {run_dir / 'learner'}")


def check(path: Path) -> LedgerReport:
    report = LedgerReport(path=path)
    steps, commits = _read(path, report)
    survivors = [s.record for s in steps]
    report.steps = len(survivors)
    seen: dict[str, int] = {}
    for record in survivors:
        for rollout in record.get("rollouts", []):
            seen[rollout["id"]] = seen.get(rollout["id"], 0) + 1
    report.trained_ids = set(seen)
    report.trained = len(seen)
    report.committed = len(commits)
    report.trained_twice = sorted(i for i, n in seen.items() if n > 1)
    report.uncommitted = sorted(set(seen) - commits)
    report.lost = sorted(commits - set(seen))
    return report


def _read(path: Path, report: LedgerReport) -> tuple[list[_Step], set[str]]:
    steps: list[_Step] = []
    commits: set[str] = set()
    last_version = -1
    for line in read(path):
        record = line.record
        if not record:
            report.torn_lines += 1
            continue
        kind = record.get("kind")
        if kind == "step":
            steps.append(_Step(offset=line.start, record=record))
            last_version = _check_version(record, last_version, report)
        elif kind == "commit":
            commits.update(record.get("ids", []))
        elif kind == "resume":
            report.resumes += 1
            kept = [s for s in steps if s.offset < int(record["position"])]
            report.abandoned_steps += len(steps) - len(kept)
            steps = kept
    return steps, commits


def _check_version(record: dict[str, Any], last: int, report: LedgerReport) -> int:
    if not record.get("published", record.get("applied")):
        return last
    version = int(record["version"])
    if version <= last:
        report.version_errors.append(
            f"step {record.get('step')} published version {version} after version {last}"
        )
    return max(last, version)
