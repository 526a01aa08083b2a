"""Two evaluation reports side by side: which figures moved more than their noise.

The interval of a difference combines the intervals of both sides (Newcombe's method),
so a change is flagged only when the whole interval lies on one side of zero: a 2-point
drop on 20 problems is noise, a 70-point drop on 200 is not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from services.evaluation.intervals import Interval
from services.evaluation.tiers import SCHEMA

DEFAULT_METRICS: Final[tuple[tuple[str, str], ...]] = (
    ("unit", "pass_at_1"),
    ("unit", "greedy"),
    ("unit", "pass_at_k"),
    ("unit", "tool_format"),
    ("system", "success_rate"),
    ("system", "infra_failure_rate"),
    ("system", "tokens_per_solved"),
    ("system", "generator_s_per_solved"),
    ("system", "sandbox_s_per_solved"),
    ("chain", "completion_rate"),
    ("chain", "recovery_rate"),
    ("chain", "tool_error_rate"),
)
#: Metrics where a rise is the bad direction.
HIGHER_IS_WORSE: Final = frozenset(
    {
        "infra_failure_rate",
        "invalid_rate",
        "tool_error_rate",
        "tokens_per_solved",
        "generator_s_per_solved",
        "sandbox_s_per_solved",
    }
)
MACRO: Final = "(macro)"
MISSING: Final = "missing"


@dataclass(frozen=True, kw_only=True)
class Delta:
    """One figure of one domain in both reports: ``diff = after - before``, its interval.

    A domain in only one report is one Delta with ``metric == "missing"``, ``tier`` naming
    the report that lacks it (``before`` or ``after``) and NaN figures.
    """

    domain: str
    tier: str
    metric: str
    before: float
    after: float
    diff: float
    low: float
    high: float
    regression: bool
    improvement: bool


def newcombe(before: Interval, after: Interval) -> tuple[float, float]:
    """Interval of ``after.value - before.value`` from the two sides' intervals."""
    diff = after.value - before.value
    down = math.hypot(after.value - after.low, before.high - before.value)
    up = math.hypot(after.high - after.value, before.value - before.low)
    return diff - down, diff + up


def delta(domain: str, tier: str, metric: str, before: Interval, after: Interval) -> Delta:
    low, high = newcombe(before, after)
    worse_up = metric in HIGHER_IS_WORSE
    return Delta(
        domain=domain,
        tier=tier,
        metric=metric,
        before=before.value,
        after=after.value,
        diff=after.value - before.value,
        low=low,
        high=high,
        regression=low > 0 if worse_up else high < 0,
        improvement=high < 0 if worse_up else low > 0,
    )


def compare(
    before: dict[str, Any],
    after: dict[str, Any],
    *,
    metrics: Sequence[tuple[str, str]] = DEFAULT_METRICS,
) -> list[Delta]:
    """Deltas of each domain by name (one ``missing`` row for a domain in one report
    only), then the macro rows over the domains in both.

    A figure measured on nothing (``n == 0``) or absent on either side (a chain tier of a
    single-turn domain, a recovery rate without failed tool calls) is left out.
    """
    old, new = _domains(before, "before"), _domains(after, "after")
    deltas: list[Delta] = []
    for name in sorted(old.keys() | new.keys()):
        if name not in new or name not in old:
            deltas.append(_missing(name, "after" if name in old else "before"))
            continue
        for tier, metric in metrics:
            pair = _pair(old[name], new[name], tier, metric)
            if pair is not None:
                deltas.append(delta(name, tier, metric, *pair))
    common = sorted(old.keys() & new.keys())
    return deltas + [
        d
        for tier, metric in metrics
        if (d := _macro_delta(old, new, common, tier, metric)) is not None
    ]


def _macro_delta(
    old: Mapping[str, Any], new: Mapping[str, Any], common: Sequence[str], tier: str, metric: str
) -> Delta | None:
    """The unweighted mean over the domains measured on both sides, as one row."""
    pairs = [p for n in common if (p := _pair(old[n], new[n], tier, metric)) is not None]
    if not pairs:
        return None
    return delta(MACRO, tier, metric, _macro([b for b, _ in pairs]), _macro([a for _, a in pairs]))


def _domains(report: Mapping[str, Any], side: str) -> Mapping[str, Any]:
    if report.get("schema") != SCHEMA:
        raise ValueError(f"{side} report has schema {report.get('schema')!r}, not {SCHEMA}")
    domains: Mapping[str, Any] = report["domains"]
    return domains


def _missing(domain: str, lacking: str) -> Delta:
    nan = math.nan
    return Delta(
        domain=domain,
        tier=lacking,
        metric=MISSING,
        before=nan,
        after=nan,
        diff=nan,
        low=nan,
        high=nan,
        regression=False,
        improvement=False,
    )


def _pair(
    before: Mapping[str, Any], after: Mapping[str, Any], tier: str, metric: str
) -> tuple[Interval, Interval] | None:
    old, new = _figure(before, tier, metric), _figure(after, tier, metric)
    if old is None or new is None or not old.n or not new.n:
        return None
    return old, new


def _figure(domain: Mapping[str, Any], tier: str, metric: str) -> Interval | None:
    figures = domain.get(tier)
    figure = figures.get(metric) if figures else None
    return Interval.from_json(figure) if figure else None


def _macro(intervals: Sequence[Interval]) -> Interval:
    """Mean of independent per-domain figures; half-widths combine in quadrature."""
    count = len(intervals)
    value = math.fsum(i.value for i in intervals) / count
    down = math.sqrt(math.fsum((i.value - i.low) ** 2 for i in intervals)) / count
    up = math.sqrt(math.fsum((i.high - i.value) ** 2 for i in intervals)) / count
    return Interval(value=value, low=value - down, high=value + up, n=sum(i.n for i in intervals))


# --------------------------------------------------------------------------- terminal table


def format_comparison(deltas: Sequence[Delta], before_name: str, after_name: str) -> str:
    """An aligned table of ``deltas``, regressions marked, and a summary line."""
    header = ("domain", "tier", "metric", before_name, after_name, "diff", "95% interval", "")
    rows = [header, *(_row(d, before_name, after_name) for d in deltas)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths).rstrip())
    lines += ["", _summary(deltas)]
    return "\n".join(lines)


def _row(d: Delta, before_name: str, after_name: str) -> tuple[str, ...]:
    if d.metric == MISSING:
        present = before_name if d.tier == "after" else after_name
        return (d.domain, "-", MISSING, "", "", "", f"only in {present}", "")
    flag = "REGRESSION" if d.regression else "improved" if d.improvement else ""
    return (
        d.domain,
        d.tier,
        d.metric,
        _number(d.before),
        _number(d.after),
        _number(d.diff, "+"),
        f"[{_number(d.low, '+')}, {_number(d.high, '+')}]",
        flag,
    )


def _number(value: float, sign: str = "") -> str:
    """Rates with three decimals; costs (tokens, seconds per solved task) with the
    digits that matter."""
    return f"{value:{sign}.3f}" if abs(value) < 10 else f"{value:{sign}.1f}"


def _summary(deltas: Sequence[Delta]) -> str:
    regressions = sum(d.regression for d in deltas)
    improvements = sum(d.improvement for d in deltas)
    compared = {d.domain for d in deltas if d.metric != MISSING and d.domain != MACRO}
    missing = {d.domain for d in deltas if d.metric == MISSING}
    line = f"{regressions} regressions, {improvements} improvements in {len(compared)} domains"
    return line + (f"; {len(missing)} domains in one report only" if missing else "")
