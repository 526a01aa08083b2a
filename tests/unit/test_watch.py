"""The reward-hacking watch on planted series: a hacked domain is flagged, a healthy one not."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from services.evaluation import watch_mismatch
from services.evaluation.figures import DomainFigures
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


# ---------------------------------------------------------------- scores per domain


def _figured(per_step: list[dict[str, DomainFigures]]) -> tuple[Step, ...]:
    return tuple(
        Step(
            step=index + 1,
            version=index + 1,
            at=float(index),
            reward_mean=0.5,
            reward_by_domain={d: 0.5 for d in domains},
            figures={},
            domains=domains,
        )
        for index, domains in enumerate(per_step)
    )


def _figures(share_top: float, top_len: float, len_mean: float, n: int = 64) -> DomainFigures:
    top = round(share_top * n)
    histogram = (n - top, 0, 0, 0, 0, 0, 0, 0, 0, top)
    return DomainFigures(n, top, top_len, len_mean, histogram)


def test_short_top_scores_are_flagged_when_they_rise_and_shrink() -> None:
    steps = []
    for index in range(12):
        late = index >= 6
        steps.append(
            {
                # The top share rises and the top samples become a fifth as long.
                "gamed": _figures(0.7 if late else 0.1, 8.0 if late else 40.0, 40.0),
                # The top share rises at the length the domain always had: learning.
                "learnt": _figures(0.7 if late else 0.1, 38.0, 40.0),
            }
        )
    flags = watch(_run(_figured(steps)))
    assert "short_top" in _kinds(flags, "gamed")
    assert "short_top" not in _kinds(flags, "learnt")
    [flag] = [f for f in flags if f.kind == "short_top"]
    assert "9% -> 70%" in flag.message and "8.0 tokens long against 40.0" in flag.message


def test_a_reward_distribution_that_jumps_is_flagged_and_a_drift_is_not() -> None:
    steps = []
    for index in range(10):
        jumped = 0.05 if index < 5 else 0.95  # all at once between v5 and v6
        steps.append(
            {
                "jumps": _figures(jumped, 30.0, 30.0),
                "drifts": _figures(0.05 + 0.9 * index / 9, 30.0, 30.0),
            }
        )
    flags = watch(_run(_figured(steps)))
    [jump] = [f for f in flags if f.kind == "score_jump"]
    assert jump.domain == "jumps" and "from v5 to v6" in jump.message


def test_few_samples_are_not_a_jump() -> None:
    steps = [{"tiny": _figures(0.0 if i % 2 else 1.0, 30.0, 30.0, n=8)} for i in range(8)]
    outcome = review(_run(_figured(steps)))
    assert not [f for f in outcome.flags if f.kind == "score_jump"]
    assert any("score jumps need" in line for line in outcome.unchecked)


def test_domain_figures_round_trip_through_a_metrics_line(tmp_path: Path) -> None:
    import json

    from services.evaluation.report.run_data import load

    figures = _figures(0.25, 12.0, 30.0)
    line = {"step": 1, "version": 1, "at": 0.0, "reward_mean": 0.5}
    bad = {"samples": "many"}
    line["domains"] = {"d": figures.as_json(), "broken": bad}  # type: ignore[assignment]
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    [step] = load(tmp_path).steps
    assert step.domains == {"d": figures}


# ---------------------------------------------------------------- logprob mismatch


def _mismatch_run(tmp_path: Path, per_step: list[dict[str, Any]]) -> RunData:
    """A run directory whose metrics lines carry the learner's mismatch figures, read back
    as ``temper report`` reads it."""
    import json

    from services.evaluation.report.run_data import load

    lines = [
        {"step": i + 1, "version": i + 1, "at": float(i), "reward_mean": 0.5, **figures}
        for i, figures in enumerate(per_step)
    ]
    (tmp_path / "learner").mkdir()
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (tmp_path / "learner" / "metrics.jsonl").write_text(text)
    return load(tmp_path)


def _measured(mean: float, engine: str = "torch", dtype: str = "float32") -> dict[str, Any]:
    return {
        "logprob_mismatch": mean,
        "logprob_mismatch_max": 4 * mean,
        "logprob_mismatch_tokens": 120,
        "engine": engine,
        "dtype": dtype,
    }


def _mismatch_flags(run: RunData) -> list[Flag]:
    return [f for f in review(run).flags if f.kind == "logprob_mismatch"]


def test_a_step_over_its_engine_and_dtype_bound_is_flagged(tmp_path: Path) -> None:
    over = watch_mismatch.THRESHOLDS["torch", "float32"] * 3
    steps = [_measured(2e-7), _measured(over), _measured(4e-7)]
    [flag] = _mismatch_flags(_mismatch_run(tmp_path, steps))
    assert (flag.domain, flag.before, flag.after) == (ALL_DOMAINS, 1e-3, pytest.approx(over))
    assert "step 2 (v2)" in flag.message and "torch/float32 bound 0.001" in flag.message
    assert "1 of 3 measured steps" in flag.message


def test_steps_under_their_bound_or_unmeasured_are_not_flagged(tmp_path: Path) -> None:
    under = watch_mismatch.THRESHOLDS["torch", "float32"] * 0.9
    not_measured = {**_measured(0.3), "logprob_mismatch_tokens": 0}
    # The same 0.03 is within bf16 numerics: only the float32 step is over.
    bf16 = _measured(0.03, "sglang", "bfloat16")
    run = _mismatch_run(tmp_path, [_measured(under), not_measured, bf16])
    assert _mismatch_flags(run) == []
    other = tmp_path / "float32"
    other.mkdir()
    [flag] = _mismatch_flags(_mismatch_run(other, [_measured(under), _measured(0.03)]))
    assert "step 2" in flag.message


def test_a_step_reads_its_engine_and_dtype_from_its_line(tmp_path: Path) -> None:
    bf16 = _measured(0.03, "sglang,torch", "bfloat16")
    unnamed = {k: v for k, v in _measured(2e-7).items() if k not in ("engine", "dtype")}
    not_text = {**_measured(2e-7), "engine": 3, "dtype": None}
    steps = _mismatch_run(tmp_path, [bf16, unnamed, not_text]).steps
    assert [(s.engine, s.dtype) for s in steps] == [
        ("sglang,torch", "bfloat16"),
        ("", ""),
        ("", ""),
    ]
    # Text is not a figure: the numbers stay what they were.
    assert "engine" not in steps[0].figures and steps[0].figure("logprob_mismatch") == 0.03


def test_unknown_engines_get_the_default_bound_and_nan_is_over() -> None:
    assert watch_mismatch.threshold("vllm", "float32") == watch_mismatch.DEFAULT_THRESHOLD
    assert watch_mismatch.threshold("", "") == watch_mismatch.DEFAULT_THRESHOLD
    # Samples of two engines in one step: the looser bound.
    assert watch_mismatch.threshold("sglang,torch", "float32") == 2e-2
    step = Step(1, 1, 0.0, 0.5, {}, {"logprob_mismatch": math.nan, "logprob_mismatch_tokens": 9})
    [flag] = _mismatch_flags(_run((step,)))
    assert "?/? bound" in flag.message


def test_no_measured_step_leaves_the_mismatch_unchecked() -> None:
    found = review(_run(_steps({"a": (0.1, 0.9)})))
    assert not [f for f in found.flags if f.kind == "logprob_mismatch"]
    assert any("logprob mismatch needs" in line for line in found.unchecked)


def test_the_report_explains_every_check_the_watch_makes() -> None:
    from typing import get_args

    from services.evaluation.report.document import Table
    from services.evaluation.report.system_sections import watch_section
    from services.evaluation.watch import FlagKind

    section = watch_section(review(_run()))
    [table] = [block for block in section.blocks if isinstance(block, Table)]
    assert [row[0] for row in table.rows] == list(get_args(FlagKind))
    [mismatch] = [text for check, text in table.rows if check == "logprob_mismatch"]
    assert "torch/float32 0.001" in mismatch and "sglang/float32 0.02" in mismatch
