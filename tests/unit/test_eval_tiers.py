"""Tiered evaluation metrics: intervals, one rollout's outcome, domain and whole reports."""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

import pytest

from protocol.messages import (
    ChatMessage,
    FinishReason,
    Rollout,
    RolloutStatus,
    ScoredRollout,
    ScoreStatus,
    Segment,
    Task,
    Timings,
    ToolCall,
    ValidatorDetail,
)
from protocol.packed import pack_f32, pack_i32, pack_u8
from services.evaluation.intervals import bootstrap_mean, bootstrap_ratio, percentiles, wilson
from services.evaluation.tiers import Outcome, build_report, domain_report


def _scored(
    *,
    domain: str = "d",
    task_id: str = "ev-0-s",
    reward: float = 1.0,
    status: ScoreStatus = ScoreStatus.SCORED,
    rollout_status: RolloutStatus = RolloutStatus.OK,
    prompt: int = 3,
    segments: Sequence[tuple[str, int]] = (("gen", 4),),
    calls: Sequence[tuple[str, float]] = (),
    finish: FinishReason = FinishReason.STOP,
    times: tuple[float | None, float | None, float | None] = (None, None, None),
    timings: Timings | None = None,
    details: Sequence[ValidatorDetail] = (),
) -> ScoredRollout:
    """A real ScoredRollout; ``segments`` are (kind, length), ``calls`` (status, seconds);
    ``times`` are the task's creation, the rollout's creation and the scoring time."""
    task_created, rollout_created, scored_at = times
    task = Task(
        id=task_id,
        domain=domain,
        prompt=[ChatMessage(role="user", content="q")],
        created_at=task_created,
    )
    parts, start = [], 0
    for kind, length in segments:
        parts.append(Segment(start=start, end=start + length, kind=kind))  # type: ignore[arg-type]
        start += length
    rollout = Rollout(
        id=f"{task_id}/0",
        task=task,
        sample_index=0,
        tokens=pack_i32(list(range(prompt + start))),
        prompt_len=prompt,
        logprobs=pack_f32([0.0] * start),
        loss_mask=pack_u8([1] * start),
        segments=parts,
        tool_calls=[
            ToolCall(turn=i, name="python", arguments="{}", status=s, duration_s=d)
            for i, (s, d) in enumerate(calls)
        ],
        finish_reason=finish,
        status=rollout_status,
        timings=timings or Timings(),
        created_at=rollout_created,
    )
    return ScoredRollout(
        id=rollout.id,
        rollout=rollout,
        reward=reward,
        status=status,
        details=list(details),
        scored_at=scored_at,
    )


def _outcome(
    problem: str = "p0",
    *,
    greedy: bool = False,
    family: str = "arithmetic",
    multi_turn: bool = False,
    **scored: object,
) -> Outcome:
    return Outcome.of(
        _scored(**scored),  # type: ignore[arg-type]
        family=family,
        problem=problem,
        greedy=greedy,
        pass_threshold=1.0,
        multi_turn=multi_turn,
    )


def _sampled(domain: str, problem: str, correct: int, wrong: int, **kw: Any) -> list[Outcome]:
    return [_outcome(problem, domain=domain, reward=1.0, **kw) for _ in range(correct)] + [
        _outcome(problem, domain=domain, reward=0.0, **kw) for _ in range(wrong)
    ]


# --------------------------------------------------------------------------- intervals


def test_wilson_matches_known_values() -> None:
    eight = wilson(8, 10)
    assert (eight.value, eight.n) == (0.8, 10)
    assert eight.low == pytest.approx(0.4902, abs=1e-4)
    assert eight.high == pytest.approx(0.9433, abs=1e-4)
    none = wilson(0, 10)
    assert none.low == 0.0 and none.high == pytest.approx(0.2775, abs=1e-4)
    assert wilson(10, 10).high == 1.0
    assert wilson(0, 0).to_json() == {"value": 0.0, "low": 0.0, "high": 1.0, "n": 0}
    with pytest.raises(ValueError):
        wilson(3, 2)


def test_bootstrap_is_deterministic_by_seed_and_covers_the_mean() -> None:
    rng = random.Random(1)
    values = [rng.random() for _ in range(50)]
    assert bootstrap_mean(values, seed=3) == bootstrap_mean(values, seed=3)
    assert bootstrap_mean(values, seed=3) != bootstrap_mean(values, seed=4)
    assert bootstrap_mean([]).n == 0
    assert bootstrap_mean([0.5, 0.5, 0.5]).to_json() == {
        "value": 0.5,
        "low": 0.5,
        "high": 0.5,
        "n": 3,
    }
    covered, widths = 0, []
    for trial in range(100):
        rng = random.Random(trial)
        sample = [rng.gauss(10.0, 2.0) for _ in range(60)]
        interval = bootstrap_mean(sample, resamples=500, seed=trial)
        covered += interval.low <= 10.0 <= interval.high
        widths.append(interval.high - interval.low)
    assert 88 <= covered <= 100
    # The normal-theory width of a 95% interval: 2 * 1.96 * sd / sqrt(n).
    assert statistics.fmean(widths) == pytest.approx(2 * 1.96 * 2.0 / math.sqrt(60), rel=0.15)


def test_percentiles_interpolate_linearly() -> None:
    found = percentiles([float(v) for v in range(1, 11)])
    assert found == pytest.approx({"p50": 5.5, "p95": 9.55, "p99": 9.91})
    assert percentiles([2.0], qs=(90, 99.9)) == {"p90": 2.0, "p99.9": 2.0}
    assert percentiles([]) == {}


# --------------------------------------------------------------------------- one outcome


def test_an_outcome_counts_turns_tools_tokens_and_times() -> None:
    outcome = _outcome(
        multi_turn=True,
        prompt=5,
        segments=(("gen", 4), ("tool", 3), ("gen", 2), ("tool", 1), ("gen", 6)),
        calls=(("nonzero_exit", 0.5), ("ok", 1.5)),
        times=(100.0, 104.0, 105.5),
        timings=Timings(generate_s=2.5, tool_s=9.0),
        details=[
            ValidatorDetail(name="math", score=1.0),
            ValidatorDetail(name="judge", score=0.0, status=ScoreStatus.INFRA_FAILURE),
        ],
    )
    assert (outcome.turns, outcome.tool_calls, outcome.tool_errors) == (3, 2, 1)
    assert outcome.tool_format_errors == 0
    assert outcome.correct and outcome.recovered and outcome.finished
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (5, 16)
    assert outcome.latency_s == 5.5 and outcome.validator_s == 1.5
    assert outcome.generator_s == 2.5
    assert outcome.sandbox_s == 2.0  # the calls' own durations, not timings.tool_s
    assert outcome.validators == {"math": 1.0}
    # Recovery needs a failed call first, and a right answer after it.
    assert not _outcome(calls=(("ok", 0.1),)).recovered
    assert not _outcome(reward=0.0, calls=(("timeout", 0.1),)).recovered


def test_an_outcome_without_segments_or_times_still_has_a_turn() -> None:
    outcome = _outcome(segments=(), timings=Timings(tool_s=3.0))
    assert outcome.completion_tokens == 0 and outcome.turns == 0
    bare = Outcome.of(
        _scored(segments=(("gen", 2),)), family="f", problem="p", greedy=True,
        pass_threshold=0.5, multi_turn=False,
    )  # fmt: skip
    assert bare.turns == 1 and bare.latency_s is None and bare.validator_s == 0.0
    assert outcome.sandbox_s == 3.0  # no call durations: the rollout's total


def test_an_infra_failed_rollout_is_an_infra_failure_whatever_its_score() -> None:
    outcome = _outcome(rollout_status=RolloutStatus.INFRA_FAILURE, reward=1.0)
    assert outcome.status == "infra_failure" and not outcome.correct
    assert _outcome(status=ScoreStatus.INVALID, reward=1.0).correct is False


# --------------------------------------------------------------------------- unit tier


def test_pass_at_1_and_pass_at_k_against_hand_computed_values() -> None:
    outcomes = [
        *_sampled("d", "a", 1, 3),
        *_sampled("d", "b", 2, 2),
        _outcome("a", greedy=True, reward=1.0),
        _outcome("b", greedy=True, reward=0.0),
    ]
    report = domain_report(outcomes, k=2)
    unit = report["unit"]
    assert (report["problems"], report["rollouts"]) == (2, 10)
    assert unit["pass_at_1"]["value"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    # pass@2 of 1 right in 4 is 1 - C(3,2)/C(4,2) = 1/2; of 2 in 4 it is 1 - 1/6.
    assert unit["pass_at_k"]["value"] == pytest.approx((1 / 2 + 5 / 6) / 2)
    assert unit["pass_at_k"]["n"] == 2 and unit["k"] == 2
    assert unit["greedy"] == wilson(1, 2).to_json()
    assert unit["pass_at_1"]["low"] <= unit["pass_at_1"]["value"] <= unit["pass_at_1"]["high"]
    assert unit["tool_format"] is None and unit["code_pass"] is None
    assert report["chain"] is None


def test_a_greedy_only_domain_takes_pass_at_1_from_the_greedy_answers() -> None:
    outcomes = [_outcome(f"p{i}", greedy=True, reward=float(i < 3)) for i in range(4)]
    unit = domain_report(outcomes, k=8)["unit"]
    assert unit["pass_at_1"]["value"] == unit["pass_at_k"]["value"] == 0.75
    assert unit["k"] == 1


def test_code_families_report_their_pass_rate_and_tool_format() -> None:
    outcomes = [
        *_sampled("c", "a", 3, 1, family="python_code"),
        _outcome("a", domain="c", family="python_code", calls=(("invalid", 0.0), ("ok", 0.1))),
        _outcome("a", domain="c", family="python_code", calls=(("nonzero_exit", 0.1),)),
    ]
    unit = domain_report(outcomes, k=4)["unit"]
    assert unit["code_pass"] == wilson(5, 6).to_json()
    assert unit["tool_format"] == wilson(2, 3).to_json()  # only the unparsable call


# --------------------------------------------------------------------------- chain tier


def test_chain_tier_recovery_tool_errors_turns_and_completion() -> None:
    gen_tool_gen = (("gen", 2), ("tool", 1), ("gen", 2))
    outcomes = [
        # Failed a tool call, then answered right: recovered.
        _outcome("a", multi_turn=True, segments=gen_tool_gen, calls=(("error", 0.0),)),
        # Failed a tool call and stayed wrong.
        _outcome(
            "b", multi_turn=True, reward=0.0, segments=gen_tool_gen, calls=(("timeout", 2.0),)
        ),
        # Clean call, right answer.
        _outcome("c", multi_turn=True, segments=gen_tool_gen, calls=(("ok", 1.0),)),
        # No tool call, cut at the token limit.
        _outcome("d", multi_turn=True, reward=0.0, finish=FinishReason.LENGTH),
        # An infra failure: not a trajectory of the policy.
        _outcome("e", multi_turn=True, rollout_status=RolloutStatus.INFRA_FAILURE),
    ]
    chain = domain_report(outcomes, k=1)["chain"]
    assert chain["recovery_rate"] == wilson(1, 2).to_json()
    assert chain["tool_error_rate"] == wilson(2, 3).to_json()
    assert chain["completion_rate"] == wilson(3, 4).to_json()
    assert chain["success_rate"] == wilson(2, 4).to_json()
    assert chain["turns"] == {"mean": 1.75, "hist": {"1": 1, "2": 3}}
    assert chain["attempts"] == {"mean": 0.75, "hist": {"0": 1, "1": 3}}


def test_chain_tier_without_failed_tool_calls_has_no_recovery_rate() -> None:
    chain = domain_report([_outcome(multi_turn=True)], k=1)["chain"]
    assert chain["recovery_rate"] is None and chain["tool_error_rate"] is None


# --------------------------------------------------------------------------- system tier


def test_system_tier_latency_and_costs() -> None:
    outcomes = [
        _outcome(
            f"p{i}",
            prompt=10,
            segments=(("gen", 5 * (i + 1)),),
            calls=(("ok", 0.25),),
            times=(0.0, 1.0 * i, 2.0 * i),
            timings=Timings(generate_s=1.0),
        )
        for i in range(1, 5)
    ]
    system = domain_report(outcomes, k=1)["system"]
    # Latencies 2, 4, 6, 8 s; validator spans 1, 2, 3, 4 s.
    assert system["latency_s"] == pytest.approx({"p50": 5.0, "p95": 7.7, "p99": 7.94})
    assert system["cost_total"] == pytest.approx(
        {
            "prompt_tokens": 40,
            "completion_tokens": 70,
            "generator_s": 4,
            "sandbox_s": 1,
            "validator_s": 10,
        }
    )
    assert system["cost_per_task"] == pytest.approx(
        {
            "prompt_tokens": 10,
            "completion_tokens": 17.5,
            "generator_s": 1,
            "sandbox_s": 0.25,
            "validator_s": 2.5,
        }
    )


def test_cost_per_solved_task_counts_the_failed_attempts_and_has_an_interval() -> None:
    # Four attempts of 5, 10, 15 and 20 tokens, the last two solved: 50 tokens for 2.
    outcomes = [
        _outcome(f"p{i}", segments=(("gen", 5 * i),), reward=float(i > 2), calls=(("ok", i),))
        for i in range(1, 5)
    ]
    system = domain_report(outcomes, k=1)["system"]
    tokens = system["tokens_per_solved"]
    assert tokens["value"] == pytest.approx(25.0) and tokens["n"] == 4
    assert tokens["low"] <= 25.0 <= tokens["high"] and tokens["high"] > tokens["low"]
    assert system["sandbox_s_per_solved"]["value"] == pytest.approx(10 / 2)
    unsolved = domain_report([_outcome("p", reward=0.0)], k=1)["system"]
    assert "tokens_per_solved" not in unsolved


def test_a_ratio_bootstrap_is_seeded_and_skips_resamples_without_a_success() -> None:
    costs, solved = [4.0, 1.0, 1.0, 2.0], [0.0, 0.0, 0.0, 1.0]
    found = bootstrap_ratio(costs, solved, resamples=500, seed=3)
    assert found is not None and found.value == pytest.approx(8.0)
    assert found == bootstrap_ratio(costs, solved, resamples=500, seed=3)
    assert math.isfinite(found.high) and found.low >= 2.0
    assert bootstrap_ratio([1.0], [0.0]) is None
    with pytest.raises(ValueError, match="2 numerators for 1"):
        bootstrap_ratio([1.0, 2.0], [1.0])


def test_infra_failures_stay_out_of_the_success_rate() -> None:
    outcomes = [
        *_sampled("d", "a", 3, 1),
        _outcome("b", status=ScoreStatus.INFRA_FAILURE, reward=0.0),
        _outcome("b", rollout_status=RolloutStatus.INFRA_FAILURE, reward=0.0),
        _outcome("c", status=ScoreStatus.INVALID, reward=0.0),
    ]
    report = domain_report(outcomes, k=1)
    system = report["system"]
    assert system["success_rate"] == wilson(3, 5).to_json()
    assert system["infra_failure_rate"] == wilson(2, 7).to_json()
    assert system["invalid_rate"] == wilson(1, 7).to_json()
    # Problem b has only infra failures: not measured, not a zero.
    assert report["unit"]["pass_at_1"]["n"] == 2
    assert report["unit"]["pass_at_1"]["value"] == pytest.approx((3 / 4 + 0) / 2)


def test_validator_means_and_completion_length() -> None:
    outcomes = [
        _outcome("a", segments=(("gen", 4),), details=[ValidatorDetail(name="m", score=1.0)]),
        _outcome("b", segments=(("gen", 8),), details=[ValidatorDetail(name="m", score=0.5)]),
    ]
    report = domain_report(outcomes, k=1)
    assert report["validators"] == {"m": 0.75} and report["completion_tokens_mean"] == 6.0


def test_a_domain_report_refuses_mixed_domains() -> None:
    with pytest.raises(ValueError):
        domain_report([_outcome(domain="x"), _outcome(domain="y")], k=1)


# --------------------------------------------------------------------------- whole report


def test_worst_domains_are_ranked_by_pass_at_1_ascending() -> None:
    outcomes = [
        *_sampled("good", "p", 9, 1),
        *_sampled("bad", "p", 1, 9),
        *_sampled("middle", "p", 5, 5),
        _outcome("p", domain="unmeasured", rollout_status=RolloutStatus.INFRA_FAILURE),
    ]
    report = build_report(outcomes, k=4, policy="ckpt", version=7, worst=2)
    assert report["overall"]["worst"] == [
        {"domain": "bad", "pass_at_1": pytest.approx(0.1)},
        {"domain": "middle", "pass_at_1": pytest.approx(0.5)},
    ]
    full = build_report(outcomes, k=4, policy="ckpt", version=7)["overall"]["worst"]
    assert [w["domain"] for w in full] == ["bad", "middle", "good"]


def test_macro_weights_domains_equally_and_micro_pools_rollouts() -> None:
    outcomes = [
        _outcome("a0", domain="small", family="f"),
        *[_outcome(f"b{i}", domain="big", family="f", reward=0.0) for i in range(9)],
        _outcome("c0", domain="other", family="g", reward=0.0),
    ]
    report = build_report(outcomes, k=1, policy="p", version=None)
    family = report["families"]["f"]
    assert family["domains"] == 2
    assert family["macro"]["pass_at_1"] == pytest.approx(0.5)
    assert family["macro"]["success_rate"] == pytest.approx(0.5)
    assert family["micro"]["pass_at_1"] == wilson(1, 10).to_json()
    assert family["micro"]["success_rate"] == wilson(1, 10).to_json()
    assert family["micro"]["pass_at_k"]["value"] == pytest.approx(0.1)
    overall = report["overall"]
    assert overall["domains"] == 3
    assert overall["macro"]["success_rate"] == pytest.approx(1 / 3)
    assert overall["micro"]["success_rate"] == wilson(1, 11).to_json()
    assert overall["macro"]["greedy"] is None  # no greedy answers anywhere
    assert overall["macro"]["infra_failure_rate"] == 0.0


def test_the_report_is_json_with_the_schema_keys() -> None:
    outcomes = [
        *_sampled("d", "a", 2, 2, multi_turn=True, times=(0.0, 1.0, 2.0)),
        _outcome("a", greedy=True, domain="d", multi_turn=True),
    ]
    report = json.loads(json.dumps(build_report(outcomes, k=4, policy="p", version=3)))
    assert (report["schema"], report["policy"], report["version"], report["samples"]) == (
        1,
        "p",
        3,
        4,
    )
    domain = report["domains"]["d"]
    assert set(domain) == {
        "family",
        "problems",
        "rollouts",
        "unit",
        "chain",
        "system",
        "validators",
        "completion_tokens_mean",
    }
    assert set(domain["unit"]) == {
        "greedy",
        "pass_at_1",
        "pass_at_k",
        "k",
        "tool_format",
        "code_pass",
    }
    assert set(domain["system"]["cost_total"]) == set(domain["system"]["cost_per_task"])
    assert set(report["overall"]) == {"domains", "macro", "micro", "worst"}
    assert set(report["families"]) == {"arithmetic"}


def test_a_problem_mean_with_no_spread_keeps_an_honest_interval() -> None:
    from services.evaluation.tiers import _problem_mean

    none_right = _problem_mean([0.0] * 20)
    assert none_right.value == 0.0 and none_right.low == 0.0
    assert none_right.high == pytest.approx(wilson(0, 20).high) and none_right.high > 0.1
    all_right = _problem_mean([1.0] * 20)
    assert all_right.high == 1.0 and all_right.low == pytest.approx(wilson(20, 20).low)
