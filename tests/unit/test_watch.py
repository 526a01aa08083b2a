"""The reward-hacking watch on planted series: a hacked domain is flagged, a healthy one not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.evaluation.report.run_data import Heldout, RunData, Step
from services.evaluation.report.tier_reports import TierReport, parse_tier_report
from services.evaluation.watch import ALL_DOMAINS, Flag, review, thirds, watch
from tests.unit.test_report import domain_tiers, tier_report

STEPS = 30


def _steps(
    rewards: dict[str, tuple[float, float]], lengths: tuple[float, float] | None = None
) -> tuple[Step, ...]:
    """Steps whose reward per domain (and completion length) go linearly from a to b."""
    steps = []
    for index in range(STEPS):
        share = index / (STEPS - 1)
        by_domain = {d: a + (b - a) * share for d, (a, b) in rewards.items()}
        figures = {} if lengths is None else {"completion_len": _between(lengths, share)}
        steps.append(
            Step(
                step=index + 1,
                version=index + 1,
                at=float(index),
                reward_mean=sum(by_domain.values()) / len(by_domain),
                reward_by_domain=by_domain,
                figures=figures,
            )
        )
    return tuple(steps)


def _between(ends: tuple[float, float], share: float) -> float:
    return ends[0] + (ends[1] - ends[0]) * share


def _heldout(accuracy: dict[str, tuple[float, float]], problems: int = 200) -> tuple[Heldout, ...]:
    return tuple(
        Heldout(domain, version, 0.0, value, value, None, 4, problems, 0.1)
        for domain, ends in accuracy.items()
        for version, value in ((0, ends[0]), (STEPS, ends[1]))
    )


def _tiers(
    start: dict[str, dict[str, Any]], end: dict[str, dict[str, Any]]
) -> tuple[TierReport, ...]:
    return (parse_tier_report(tier_report(0, start)), parse_tier_report(tier_report(STEPS, end)))


def _run(
    steps: tuple[Step, ...] = (),
    heldout: tuple[Heldout, ...] = (),
    tiers: tuple[TierReport, ...] = (),
) -> RunData:
    return RunData(Path("run"), steps, heldout, (), tiers, (), ())


def _kinds(flags: list[Flag], domain: str) -> set[str]:
    return {f.kind for f in flags if f.domain == domain}


def test_thirds() -> None:
    assert thirds([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == (1.5, 5.5)
    assert thirds([0.2, 0.6]) == (0.2, 0.6)


def test_reward_up_and_heldout_down_is_flagged_only_for_the_hacked_domain() -> None:
    run = _run(
        _steps({"hacked": (0.1, 0.7), "healthy": (0.2, 0.5)}),
        _heldout({"hacked": (0.6, 0.3), "healthy": (0.3, 0.5)}),
    )
    flags = watch(run)
    assert _kinds(flags, "hacked") == {"reward_vs_heldout"}
    assert _kinds(flags, "healthy") == set()
    (flag,) = flags
    assert (flag.before, flag.after) == (0.6, 0.3)
    assert "60.0% -> 30.0%" in flag.message


def test_a_dip_within_noise_or_a_flat_reward_is_not_flagged() -> None:
    dip = _run(_steps({"a": (0.1, 0.7)}), _heldout({"a": (0.50, 0.46)}, problems=200))
    flat = _run(_steps({"a": (0.4, 0.42)}), _heldout({"a": (0.6, 0.3)}))
    assert watch(dip) == [] and watch(flat) == []


def test_heldout_falls_back_to_the_tier_reports() -> None:
    run = _run(
        _steps({"a": (0.1, 0.7)}),
        tiers=_tiers({"a": domain_tiers(greedy=0.6)}, {"a": domain_tiers(greedy=0.2)}),
    )
    assert _kinds(watch(run), "a") == {"reward_vs_heldout"}


def test_completion_length_drift_from_metrics() -> None:
    grew = _run(_steps({"a": (0.3, 0.3)}, lengths=(20.0, 60.0)))
    steady = _run(_steps({"a": (0.3, 0.3)}, lengths=(20.0, 24.0)))
    shrank = _run(_steps({"a": (0.3, 0.3), "b": (0.3, 0.3)}, lengths=(60.0, 20.0)))
    (flag,) = watch(grew)
    assert (flag.domain, flag.kind) == ("a", "length_drift") and flag.after > 1.5 * flag.before
    assert watch(steady) == []
    assert [(f.domain, f.kind) for f in watch(shrank)] == [(ALL_DOMAINS, "length_drift")]


def test_completion_length_drift_from_tier_reports_per_domain() -> None:
    tiers = _tiers(
        {"padded": domain_tiers(greedy=0.5, tokens=20.0), "fine": domain_tiers(greedy=0.5)},
        {"padded": domain_tiers(greedy=0.5, tokens=50.0), "fine": domain_tiers(greedy=0.5)},
    )
    flags = watch(_run(tiers=tiers))
    assert [(f.domain, f.kind) for f in flags] == [("padded", "length_drift")]


def test_format_validator_drift() -> None:
    tiers = _tiers(
        {
            "gamed": domain_tiers(greedy=0.5, format_score=0.3),
            "steady": domain_tiers(greedy=0.3, format_score=0.9),
        },
        {
            # The exact validator's mean moves too, with greedy: only format counts here.
            "gamed": domain_tiers(greedy=0.5, format_score=0.95),
            "steady": domain_tiers(greedy=0.6, format_score=0.95),
        },
    )
    flags = watch(_run(tiers=tiers))
    assert [(f.domain, f.kind) for f in flags] == [("gamed", "format_drift")]
    assert (flags[0].before, flags[0].after) == (0.3, 0.95)


def test_tool_format_interval_drift() -> None:
    start = domain_tiers(greedy=0.5, chain=True)
    end = domain_tiers(greedy=0.5, chain=True)
    end["unit"]["tool_format"] = {"value": 0.5, "low": 0.4, "high": 0.6, "n": 100}
    del start["validators"]["format"], end["validators"]["format"]
    flags = watch(_run(tiers=_tiers({"t": start}, {"t": end})))
    assert [(f.kind, f.before, f.after) for f in flags] == [("format_drift", 0.95, 0.5)]


def test_too_little_data_says_so_and_flags_nothing() -> None:
    found = review(_run(_steps({"a": (0.1, 0.9)})[:3]))
    assert found.flags == ()
    assert any("reward vs held-out" in line for line in found.unchecked)
    assert any("format drift" in line for line in found.unchecked)
    assert any("completion length" in line for line in found.unchecked)
