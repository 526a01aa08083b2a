"""A run directory read into typed, frozen records, whatever part of it exists.

``temper train`` writes the files while it runs, so the last line of a JSONL file may
be cut short: such lines are skipped and counted, never fatal.  A file that is absent
leaves its records empty and its name in ``RunData.missing``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from services.evaluation.figures import DomainFigures
from services.evaluation.report.tier_reports import TierReport, parse_tier_report

METRICS = Path("learner/metrics.jsonl")
HELDOUT = Path("eval/heldout.jsonl")
STATS = Path("stats.json")
TIERS = Path("eval/tiers")

T = TypeVar("T")


@dataclass(frozen=True)
class Step:
    """One line of ``learner/metrics.jsonl``; ``figures`` holds every numeric key."""

    step: int
    version: int
    at: float
    reward_mean: float
    reward_by_domain: Mapping[str, float]
    figures: Mapping[str, float]
    #: Versions behind the learner -> samples of the step's batch (``staleness_counts``);
    #: empty for metrics written before the learner recorded it.
    staleness_counts: Mapping[int, int] = field(default_factory=dict)
    #: Per domain: samples at the top score, their length, the reward histogram (empty
    #: for metrics written before the learner recorded them).
    domains: Mapping[str, DomainFigures] = field(default_factory=dict)
    #: The engines that sampled the step's measured samples (sorted, comma-separated) and
    #: the dtype the learner computed in: what its ``logprob_mismatch`` is judged against.
    #: Empty when the step measured nothing, or for metrics written before the learner
    #: recorded them.
    engine: str = ""
    dtype: str = ""

    def figure(self, key: str) -> float | None:
        return self.figures.get(key)


def sample_staleness(steps: Iterable[Step]) -> dict[int, int]:
    """Versions behind -> samples, over every step; empty when no step has counts."""
    total: Counter[int] = Counter()
    for step in steps:
        total.update(step.staleness_counts)
    return dict(sorted(total.items()))


@dataclass(frozen=True)
class Heldout:
    """One line of ``eval/heldout.jsonl``: one evaluation of one domain at one version."""

    domain: str
    version: int
    elapsed_s: float
    greedy: float
    sampled: float
    pass_at_k: float | None
    k: int
    problems: int
    chance: float | None


@dataclass(frozen=True)
class ServiceStats:
    """The last ``Stats`` of one service instance, from ``stats.json``."""

    key: str
    service: str
    sent_at: float
    values: Mapping[str, float]


@dataclass(frozen=True)
class RunData:
    run_dir: Path
    steps: tuple[Step, ...]
    heldout: tuple[Heldout, ...]
    stats: tuple[ServiceStats, ...]
    #: Tier reports in version order (the start policy, ``None``, first).
    tiers: tuple[TierReport, ...]
    #: Files (relative to ``run_dir``) that were not there.
    missing: tuple[str, ...]
    #: Lines or files that could not be read (a torn last line, a malformed report).
    skipped: tuple[str, ...]

    def domains(self) -> tuple[str, ...]:
        """Every domain the run trained on or evaluated, in order of first appearance."""
        seen: dict[str, None] = {}
        for step in self.steps:
            seen.update(dict.fromkeys(step.reward_by_domain))
        seen.update(dict.fromkeys(h.domain for h in self.heldout))
        for report in self.tiers:
            seen.update(dict.fromkeys(report.domains))
        return tuple(seen)

    def service(self, name: str) -> tuple[ServiceStats, ...]:
        return tuple(s for s in self.stats if s.service == name)


def load(run_dir: Path) -> RunData:
    missing: list[str] = []
    skipped: list[str] = []
    steps = _records(run_dir, METRICS, _step, missing, skipped)
    heldout = _records(run_dir, HELDOUT, _heldout, missing, skipped)
    return RunData(
        run_dir=run_dir,
        steps=tuple(sorted(steps, key=lambda s: s.step)),
        heldout=tuple(heldout),
        stats=_stats(run_dir, missing, skipped),
        tiers=_tiers(run_dir, missing, skipped),
        missing=tuple(missing),
        skipped=tuple(skipped),
    )


def _records(
    run_dir: Path,
    relative: Path,
    parse: Callable[[dict[str, Any]], T],
    missing: list[str],
    skipped: list[str],
) -> list[T]:
    path = run_dir / relative
    if not path.is_file():
        missing.append(str(relative))
        return []
    records = []
    for number, line in _lines(path):
        try:
            records.append(parse(json.loads(line)))
        except (ValueError, KeyError, TypeError, AttributeError):
            skipped.append(f"{relative}:{number}")
    return records


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    text = path.read_text(errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield number, line


def _step(line: dict[str, Any]) -> Step:
    figures = {
        key: float(value)
        for key, value in line.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
    return Step(
        step=int(line["step"]),
        version=int(line.get("version", line["step"])),
        at=float(line["at"]),
        reward_mean=float(line["reward_mean"]),
        reward_by_domain={str(k): float(v) for k, v in line.get("reward_by_domain", {}).items()},
        figures=figures,
        staleness_counts=_staleness_counts(line.get("staleness_counts")),
        domains=_domain_figures(line.get("domains")),
        engine=_label(line.get("engine")),
        dtype=_label(line.get("dtype")),
    )


def _label(raw: object) -> str:
    """A text field of a line; anything else (absent, null, a number) reads as unknown."""
    return raw if isinstance(raw, str) else ""


def _domain_figures(raw: object) -> dict[str, DomainFigures]:
    """The figures a line holds; a malformed entry is left out, not the step."""
    if not isinstance(raw, dict):
        return {}
    found: dict[str, DomainFigures] = {}
    for name, entry in raw.items():
        try:
            found[str(name)] = DomainFigures.from_json(entry)
        except (KeyError, TypeError, ValueError):
            continue
    return found


def _staleness_counts(raw: object) -> dict[int, int]:
    """The counts a line holds; entries that are not ``"<versions>": <samples>`` are left out,
    so one bad entry costs neither the step nor the rest of its counts."""
    if not isinstance(raw, dict):
        return {}
    counts: dict[int, int] = {}
    for key, value in raw.items():
        behind = _whole(key)
        samples = value if isinstance(value, int) and not isinstance(value, bool) else 0
        if behind is not None and samples > 0:
            counts[behind] = counts.get(behind, 0) + samples
    return dict(sorted(counts.items()))


def _whole(key: object) -> int | None:
    text = str(key).strip()
    # isdigit alone admits digits such as "²" that int() refuses.
    return int(text) if text.isascii() and text.isdigit() else None


def _heldout(line: dict[str, Any]) -> Heldout:
    k = int(line.get("samples", 0))
    pass_at_k = line.get(f"pass_at_{k}")
    chance = line.get("chance")
    return Heldout(
        domain=str(line["domain"]),
        version=int(line["version"]),
        elapsed_s=float(line.get("elapsed_s", 0.0)),
        greedy=float(line["greedy_accuracy"]),
        sampled=float(line["sampled_accuracy"]),
        pass_at_k=None if pass_at_k is None else float(pass_at_k),
        k=k,
        problems=int(line.get("problems", 0)),
        chance=None if chance is None else float(chance),
    )


def _stats(run_dir: Path, missing: list[str], skipped: list[str]) -> tuple[ServiceStats, ...]:
    path = run_dir / STATS
    if not path.is_file():
        missing.append(str(STATS))
        return ()
    try:
        raw = json.loads(path.read_text())
        return tuple(_service_stats(key, entry) for key, entry in sorted(raw.items()))
    except (ValueError, KeyError, TypeError, AttributeError):
        skipped.append(str(STATS))
        return ()


def _service_stats(key: str, entry: dict[str, Any]) -> ServiceStats:
    values = entry.get("values", {})
    return ServiceStats(
        key=key,
        service=str(entry.get("service", key.split("/", 1)[0])),
        sent_at=float(entry.get("sent_at", 0.0)),
        values={str(k): float(v) for k, v in values.items() if isinstance(v, int | float)},
    )


def _tiers(run_dir: Path, missing: list[str], skipped: list[str]) -> tuple[TierReport, ...]:
    folder = run_dir / TIERS
    if not folder.is_dir():
        missing.append(f"{TIERS}/")
        return ()
    reports = []
    for path in sorted(folder.glob("v*.json")):
        try:
            reports.append(parse_tier_report(json.loads(path.read_text())))
        except (ValueError, KeyError, TypeError, AttributeError):
            skipped.append(f"{TIERS / path.name}")
    return tuple(sorted(reports, key=lambda r: -1 if r.version is None else r.version))
