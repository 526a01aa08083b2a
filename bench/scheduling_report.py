"""bench_scheduling's figures: what one lane measured, and the report printed from the
lanes of every repeat (ranges over repeats, the off/on ratio against the issue's goal)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench_sandbox import percentile

#: The issue's goal: high-tier p95 this many times lower with preemption on.
GOAL_RATIO = 5.0
HIGH_TIER, LOW_TIER = 0, 3


@dataclass(frozen=True, kw_only=True)
class Workload:
    slots: int = 2
    #: High-tier tasks measured per lane (after one unmeasured warm-up task).
    high_tasks: int = 20
    #: Mean gap between high-tier arrivals; each gap is drawn from 0.5x..1.5x of it.
    interval_s: float = 0.7
    #: Low-tier tasks available to a lane (more than its slots can finish).
    low_tasks: int = 200
    #: Low-tier tasks kept waiting in their stream besides those in the slots.
    backlog: int = 2
    max_turns: int = 24
    turn_tokens: int = 96
    high_tokens: int = 16
    seed: int = 0


@dataclass(kw_only=True)
class Lane:
    """One generator's figures, preemption on or off."""

    preemption: bool
    queued: list[float] = field(default_factory=list)
    published: list[float] = field(default_factory=list)
    #: The high-tier tasks' own generation (``timings.total_s``).
    generating: list[float] = field(default_factory=list)
    low_trajectories: int = 0
    low_turns: int = 0
    low_generate_s: float = 0.0
    low_tool_s: float = 0.0
    wall_s: float = 0.0
    #: Mean share of the slots in use while the high-tier tasks came (sampled).
    busy: float = 0.0
    #: The machine's 1-minute load average at the end (others' work slows every turn).
    load: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return "on" if self.preemption else "off"

    def stat(self, key: str) -> float:
        return self.stats.get(key, 0.0)

    @property
    def turn_s(self) -> float:
        """Engine time of a plain low-tier turn."""
        return self.low_generate_s / self.low_turns if self.low_turns else 0.0

    @property
    def overhead_s(self) -> float:
        """Save plus restore time per preempted trajectory."""
        spent = self.stat("time_preempt_save_s") + self.stat("time_preempt_restore_s")
        preempted = self.stat("preemptions")
        return spent / preempted if preempted else 0.0


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.0f} ms"


def span(values: Sequence[float], unit: str = "ms", digits: int = 0) -> str:
    """``low-high`` over repeats: seconds in ms, or a ratio (unit ``x``, or ``%``)."""
    if not values:
        return "n/a"
    if unit == "x":
        return f"{min(values):.1f}-{max(values):.1f}x"
    if unit == "%":
        return f"{100 * min(values):.1f}-{100 * max(values):.1f}%"
    return f"{min(values) * 1000:.{digits}f}-{max(values) * 1000:.{digits}f} ms"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def ratio(off: Lane, on: Lane) -> float:
    p95_on = percentile(on.queued, 95)
    return percentile(off.queued, 95) / p95_on if p95_on else 0.0


def lane_line(lane: Lane) -> str:
    preempted = f"{lane.stat('preemptions'):>11.0f}{lane.stat('resumes'):>9.0f}{lane.load:>6.1f}"
    return (
        f"    {lane.name:<5}{ms(percentile(lane.queued, 50))}{ms(percentile(lane.queued, 95))}"
        f"{ms(percentile(lane.published, 50))}{ms(percentile(lane.published, 95))}{preempted}"
    )


def repeat_lines(index: int, lanes: Sequence[Lane]) -> list[str]:
    lines = [
        f"  repeat {index + 1} ({lanes[0].name} first)",
        f"    {'':<5}{'queue p50':>11}{'p95':>11}{'publ. p50':>11}{'p95':>11}"
        f"{'preempted':>11}{'resumed':>9}{'load':>6}",
    ]
    lines += [lane_line(lane) for lane in lanes]
    off, on = by_side(lanes)
    if off is not None and on is not None:
        lines.append(f"    p95 queue off/on: {ratio(off, on):.1f}x")
    return lines


def by_side(lanes: Sequence[Lane]) -> tuple[Lane | None, Lane | None]:
    off = next((lane for lane in lanes if not lane.preemption), None)
    on = next((lane for lane in lanes if lane.preemption), None)
    return off, on


def side_lines(name: str, lanes: Sequence[Lane]) -> list[str]:
    """A side's figures over repeats: ranges, and where its time goes (medians)."""
    if not lanes:
        return [f"  preemption {name}: not measured"]

    def median(values: Sequence[float]) -> float:
        return statistics.median(values) if values else 0.0

    rest = [
        median([p - q - g for p, q, g in zip(x.published, x.queued, x.generating, strict=True)])
        for x in lanes
    ]
    trajectories = sum(x.low_trajectories for x in lanes) or 1
    queue_p50 = span([percentile(x.queued, 50) for x in lanes])
    return [
        f"  preemption {name}: high-tier queue p50 {queue_p50}"
        f", p95 {span([percentile(x.queued, 95) for x in lanes])}; submit->published p50 "
        f"{span([percentile(x.published, 50) for x in lanes])}, p95 "
        f"{span([percentile(x.published, 95) for x in lanes])}",
        f"    high-tier time (medians): waiting {span([median(x.queued) for x in lanes])}, "
        f"generating {span([median(x.generating) for x in lanes])}, publishing and "
        f"transport {span(rest)}",
        f"    low-tier: {trajectories} trajectories finished, "
        f"{sum(x.low_turns for x in lanes) / trajectories:.1f} turns each, per trajectory "
        f"generating {sum(x.low_generate_s for x in lanes) / trajectories:.2f} s, tools "
        f"{sum(x.low_tool_s for x in lanes) / trajectories:.3f} s; slots in use "
        f"{span([x.busy for x in lanes], '%')} of the time",
    ]


def overhead_lines(on: Sequence[Lane]) -> list[str]:
    preempted = [x for x in on if x.stat("preemptions")]
    if not preempted:
        return ["  preemption overhead: no trajectory was preempted"]
    turns = [x.turn_s for x in preempted]
    share = [x.overhead_s / x.turn_s for x in preempted if x.turn_s]
    suspended = sum(x.stat("preemptions") for x in preempted)
    resumed = sum(x.stat("resumes") for x in preempted)
    return [
        f"  preemption overhead per trajectory (save + restore): "
        f"{span([x.overhead_s for x in preempted], digits=2)} vs a plain turn {span(turns)} "
        f"({span(share, '%')} of a turn)",
        f"    save {span([_mean(x, 'preempt_save') for x in preempted], digits=2)}, restore "
        f"{span([_mean(x, 'preempt_restore') for x in preempted], digits=2)} each; preempted "
        f"{suspended:.0f}, resumed {resumed:.0f} over {len(preempted)} lanes",
    ]


def _mean(lane: Lane, stage: str) -> float:
    count = lane.stat(f"count_{stage}")
    return lane.stat(f"time_{stage}_s") / count if count else 0.0


def render(rounds: Sequence[Sequence[Lane]], work: Workload, note: str = "") -> list[str]:
    """The report; pure, so it is testable without running a generator."""
    lines = [
        f"generator: torch engine, tiny tool-calling policy, {work.slots} slots; low tier "
        f"{LOW_TIER}: {work.max_turns}-turn tool tasks (<= {work.turn_tokens} tokens a turn) "
        f"saturating them; high tier {HIGH_TIER}: {work.high_tasks} single-turn tasks per lane, "
        f"about {work.interval_s:g} s apart; local tools, so a save or restore has no sandbox "
        "session to snapshot",
    ]
    if note:
        lines.append(f"  {note}")
    for index, lanes in enumerate(rounds):
        lines += repeat_lines(index, lanes)
    pairs = [by_side(lanes) for lanes in rounds]
    off = [x for x, _ in pairs if x is not None]
    on = [y for _, y in pairs if y is not None]
    lines += ["", f"over {len(rounds)} repeats (ranges):"]
    lines += side_lines("off", off) + side_lines("on", on)
    if on:
        lines += overhead_lines(on)
        ratios = [ratio(x, y) for x, y in pairs if x is not None and y is not None]
        middle = statistics.median(ratios)
        lines.append(
            f"  high-tier p95 queue off/on: {span(ratios, 'x')} (median {middle:.1f}x; goal >= "
            f"{GOAL_RATIO:g}x)  {verdict(middle >= GOAL_RATIO)}"
        )
    return lines
