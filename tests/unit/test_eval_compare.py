"""Comparing two evaluation reports: real changes flagged, noise not."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from services.evaluation.compare import Delta, compare, format_comparison, newcombe
from services.evaluation.intervals import Interval, wilson
from services.evaluation.tiers import Outcome, build_report


def _outcome(domain: str, problem: str, correct: bool, status: str = "scored") -> Outcome:
    return Outcome(
        domain=domain,
        family="f",
        problem=problem,
        greedy=False,
        status=status,
        correct=correct and status == "scored",
        reward=float(correct),
        multi_turn=False,
        finished=True,
        turns=1,
        tool_calls=0,
        tool_errors=0,
        tool_format_errors=0,
        recovered=False,
        latency_s=1.0,
        prompt_tokens=10,
        completion_tokens=5,
        generator_s=0.1,
        sandbox_s=0.0,
        validator_s=0.1,
        validators={},
    )


def planted_domain(name: str, problems: int, samples: int, rate: float) -> list[Outcome]:
    """``problems`` problems of ``samples`` rollouts, ``rate`` of all rollouts correct."""
    right = round(rate * problems * samples)
    return [_outcome(name, f"p{i // samples}", i < right) for i in range(problems * samples)]


def planted_report(*domains: list[Outcome]) -> dict[str, Any]:
    outcomes = [o for d in domains for o in d]
    return build_report(outcomes, k=4, policy="p", version=None)


def _find(deltas: list[Delta], domain: str, metric: str) -> Delta:
    (found,) = [d for d in deltas if d.domain == domain and d.metric == metric]
    return found


def test_newcombe_combines_the_half_widths_on_the_right_sides() -> None:
    before = Interval(value=0.5, low=0.4, high=0.7, n=10)
    after = Interval(value=0.3, low=0.25, high=0.6, n=10)
    low, high = newcombe(before, after)
    # Down: the after side's lower half (0.05) and the before side's upper half (0.2).
    assert low == pytest.approx(-0.2 - math.hypot(0.05, 0.2))
    assert high == pytest.approx(-0.2 + math.hypot(0.3, 0.1))


def test_a_planted_regression_is_flagged_and_noise_is_not() -> None:
    before = planted_report(planted_domain("A", 200, 1, 0.9), planted_domain("B", 20, 5, 0.50))
    after = planted_report(planted_domain("A", 200, 1, 0.2), planted_domain("B", 20, 5, 0.48))
    deltas = compare(before, after)
    drop = _find(deltas, "A", "pass_at_1")
    assert drop.regression and not drop.improvement
    assert drop.diff == pytest.approx(-0.7) and drop.low < -0.7 < drop.high < 0
    assert _find(deltas, "A", "success_rate").regression
    noise = _find(deltas, "B", "pass_at_1")
    assert noise.diff == pytest.approx(-0.02)
    assert not noise.regression and noise.low < 0 < noise.high
    assert not any(d.regression for d in deltas if d.domain == "B")
    # Greedy is measured on nothing in these reports: no row.
    assert not [d for d in deltas if d.metric == "greedy"]
    # The other way round the same change is an improvement.
    assert _find(compare(after, before), "A", "pass_at_1").improvement


def test_more_infra_failures_are_a_regression() -> None:
    steady = [_outcome("A", f"p{i}", True) for i in range(100)]
    failing = [
        _outcome("A", f"p{i}", True, "infra_failure" if i < 40 else "scored") for i in range(100)
    ]
    deltas = compare(planted_report(steady), planted_report(failing))
    infra = _find(deltas, "A", "infra_failure_rate")
    assert infra.diff == pytest.approx(0.4) and infra.regression and not infra.improvement
    # Accuracy among what ran is unchanged: not a regression of the policy.
    assert not _find(deltas, "A", "success_rate").regression
    assert _find(
        compare(planted_report(failing), planted_report(steady)), "A", "infra_failure_rate"
    ).improvement


def test_a_solved_task_that_costs_more_is_a_regression_and_one_that_costs_less_is_not() -> None:
    def costly(tokens: int) -> list[Outcome]:
        return [
            dataclasses.replace(o, completion_tokens=tokens)
            for o in planted_domain("A", 50, 4, 0.5)
        ]

    deltas = compare(planted_report(costly(5)), planted_report(costly(50)))
    tokens = _find(deltas, "A", "tokens_per_solved")
    assert (tokens.before, tokens.after) == pytest.approx((10.0, 100.0))
    assert tokens.regression and not tokens.improvement
    cheaper = _find(
        compare(planted_report(costly(50)), planted_report(costly(5))), "A", "tokens_per_solved"
    )
    assert cheaper.improvement and not cheaper.regression
    (line,) = [
        ln
        for ln in format_comparison(deltas, "a", "b").splitlines()
        if ln.startswith("A ") and "tokens" in ln
    ]
    assert line.split()[3:6] == ["10.0", "100.0", "+90.0"] and line.endswith("REGRESSION")


def test_domains_in_one_report_only_are_listed_not_fatal() -> None:
    before = planted_report(planted_domain("A", 20, 1, 0.5), planted_domain("gone", 10, 1, 0.5))
    after = planted_report(planted_domain("A", 20, 1, 0.5), planted_domain("new", 10, 1, 0.5))
    deltas = compare(before, after)
    gone, new = _find(deltas, "gone", "missing"), _find(deltas, "new", "missing")
    assert (gone.tier, new.tier) == ("after", "before")
    assert not gone.regression and math.isnan(gone.diff)
    table = format_comparison(deltas, "v1", "v2")
    assert "only in v1" in table and "only in v2" in table
    assert table.splitlines()[-1] == (
        "0 regressions, 0 improvements in 1 domains; 2 domains in one report only"
    )


def test_macro_rows_average_the_domains_in_both_reports() -> None:
    before = planted_report(planted_domain("A", 50, 1, 0.8), planted_domain("B", 50, 1, 0.4))
    after = planted_report(planted_domain("A", 50, 1, 0.6), planted_domain("B", 50, 1, 0.4))
    macro = _find(compare(before, after), "(macro)", "success_rate")
    assert (macro.before, macro.after) == pytest.approx((0.6, 0.5))
    assert macro.tier == "system" and macro.low < macro.diff < macro.high
    a = compare(before, after, metrics=(("system", "success_rate"),))
    assert [d.domain for d in a] == ["A", "B", "(macro)"]


def test_the_table_is_aligned_and_marks_regressions() -> None:
    before = planted_report(planted_domain("A", 200, 1, 0.9), planted_domain("B", 20, 5, 0.50))
    after = planted_report(planted_domain("A", 200, 1, 0.2), planted_domain("B", 20, 5, 0.48))
    deltas = compare(before, after, metrics=(("unit", "pass_at_1"), ("system", "success_rate")))
    lines = format_comparison(deltas, "before.json", "after.json").splitlines()
    assert lines[0].split()[:5] == ["domain", "tier", "metric", "before.json", "after.json"]
    rows = [line for line in lines[2:] if line]
    assert len(rows) == len(deltas) + 1
    diff_column = lines[0].index("diff")
    assert all(row[diff_column - 2 : diff_column] == "  " for row in rows[:-1])
    flagged = [row for row in rows if row.endswith("REGRESSION")]
    assert len(flagged) == sum(d.regression for d in deltas) == 4  # A twice, macro twice
    assert rows[-1] == "4 regressions, 0 improvements in 2 domains"


def test_a_report_of_another_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="schema"):
        compare({"schema": 2, "domains": {}}, planted_report(planted_domain("A", 5, 1, 0.5)))


def test_wilson_rates_of_equal_reports_never_move() -> None:
    report = planted_report(planted_domain("A", 30, 2, 0.5))
    deltas = compare(report, report)
    assert deltas and all(d.diff == 0 and not d.regression and not d.improvement for d in deltas)
    assert _find(deltas, "A", "success_rate").before == wilson(30, 60).value
