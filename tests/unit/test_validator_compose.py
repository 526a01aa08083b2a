"""Weighted composition, typed failures, building validators from specs, per-domain stats."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Mapping
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from protocol.messages import (
    ChatMessage,
    Rollout,
    RolloutStatus,
    SandboxExec,
    SandboxLimits,
    SandboxResult,
    ScoredRollout,
    ScoreStatus,
    Task,
)
from services.domains import Domain, DomainError, DomainRegistry, Problem, ValidatorSpec
from services.domains.params import Params
from services.domains.ranges import UNIT, ScoreRange
from services.validator.base import (
    InfraFailure,
    InvalidRollout,
    RuleValidator,
    Validator,
    Verdict,
)
from services.validator.compose import Judge, Panel, Scorer, build_panel, combine, run_judge
from services.validator.factory import Resources
from services.validator.stats import UNKNOWN, DomainStats

REPO = Path(__file__).resolve().parents[2]


class Fixed:
    def __init__(self, score: float) -> None:
        self.value = score

    async def score(self, rollout: Rollout) -> Verdict:
        return Verdict(self.value, "fixed")


class Raises:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def score(self, rollout: Rollout) -> Verdict:
        raise self.error


class Sleeps:
    async def score(self, rollout: Rollout) -> Verdict:
        await asyncio.sleep(30)
        return Verdict(1.0)


def half(params: Params, domain: Domain, resources: Resources) -> Validator:
    """A plugin validator kind, named ``tests.unit.test_validator_compose:half`` in specs."""
    return Fixed(params.number("value", 0.5, 0.0, 1.0))


class OneProblem:
    def draw(self, rng: random.Random) -> Problem:
        return Problem(
            key="k", question="q", metadata={"answer": "1"}, reference="<answer>1</answer>"
        )


def judge(
    validator: object,
    weight: float = 1.0,
    name: str = "j",
    timeout_s: float = 5.0,
    score_range: ScoreRange = UNIT,
) -> Judge:
    return Judge(
        name=name,
        kind=name,
        weight=weight,
        timeout_s=timeout_s,
        validator=validator,  # type: ignore[arg-type]
        score_range=score_range,
    )


def rollout(domain: str = "d", **fields: object) -> Rollout:
    task = Task(
        id="t1",
        domain=domain,
        prompt=[ChatMessage(role="user", content="q")],
        metadata={"answer": "1"},
    )
    return Rollout(id="t1/0", task=task, sample_index=0, **fields)  # type: ignore[arg-type]


def domain(name: str = "d", *specs: ValidatorSpec) -> Domain:
    return Domain(
        name=name, source=OneProblem(), validators=specs or (ValidatorSpec(kind="exact"),)
    )


async def test_reward_is_the_weighted_sum() -> None:
    panel = Panel(
        domain(),
        (
            judge(Fixed(1.0), 0.7, "a"),
            judge(Fixed(0.5), 0.3, "b"),
            judge(Fixed(-1.0), 0.1, "c", score_range=ScoreRange(-1.0, 0.0)),
        ),
    )
    result = await panel.judge(rollout())
    assert result.status is ScoreStatus.SCORED
    assert result.reward == pytest.approx(0.7 + 0.15 - 0.1)
    assert [(d.name, d.weight, d.score) for d in result.details] == [
        ("a", 0.7, 1.0),
        ("b", 0.3, 0.5),
        ("c", 0.1, -1.0),
    ]


async def test_a_raising_validator_is_an_infra_failure_with_the_error() -> None:
    detail = await run_judge(judge(Raises(KeyError("boom"))), rollout())
    assert detail.status is ScoreStatus.INFRA_FAILURE and "KeyError" in detail.message
    typed = await run_judge(judge(Raises(InfraFailure("sandbox down"))), rollout())
    assert typed.status is ScoreStatus.INFRA_FAILURE and "sandbox down" in typed.message


async def test_a_slow_validator_times_out_as_infra_failure() -> None:
    detail = await run_judge(judge(Sleeps(), timeout_s=0.01), rollout())
    assert (detail.status, detail.message) == (ScoreStatus.INFRA_FAILURE, "timed out after 0.01s")


async def test_non_finite_scores_are_infra_failures() -> None:
    detail = await run_judge(judge(Fixed(math.nan)), rollout())
    assert detail.status is ScoreStatus.INFRA_FAILURE and detail.score == 0.0


async def test_invalid_rollouts_and_precedence() -> None:
    invalid = await run_judge(judge(Raises(InvalidRollout("no reference"))), rollout())
    assert invalid.status is ScoreStatus.INVALID
    infra = await run_judge(judge(Raises(InfraFailure("down")), name="x"), rollout())
    ok = await run_judge(judge(Fixed(1.0)), rollout())
    mixed = combine([ok, invalid, infra])
    assert (mixed.status, mixed.reward, mixed.error) == (ScoreStatus.INFRA_FAILURE, 0.0, "x: down")
    assert combine([ok, invalid]).status is ScoreStatus.INVALID
    assert len(mixed.details) == 3


def scorer(*domains: Domain) -> Scorer:
    return Scorer(DomainRegistry(domains), Resources(), timeout_s=5.0, validator="v/1", plugins={})


async def test_scorer_passes_failed_rollouts_through_and_refuses_unknown_domains() -> None:
    judge_all = scorer(domain("d"))
    infra = await judge_all.score(rollout(status=RolloutStatus.INFRA_FAILURE, error="engine died"))
    assert (infra.status, infra.error, infra.details) == (
        ScoreStatus.INFRA_FAILURE,
        "engine died",
        [],
    )
    invalid = await judge_all.score(rollout(status=RolloutStatus.INVALID))
    assert invalid.status is ScoreStatus.INVALID
    unknown = await judge_all.score(rollout(domain="elsewhere"))
    assert unknown.status is ScoreStatus.INVALID and "unknown domain 'elsewhere'" in (
        unknown.error or ""
    )
    good = await judge_all.score(rollout(completion_text="<answer>1</answer>"))
    assert (good.id, good.status, good.reward, good.validator) == (
        "t1/0",
        ScoreStatus.SCORED,
        1.0,
        "v/1",
    )


async def test_plugin_validator_kinds_and_per_spec_timeouts() -> None:
    spec = ValidatorSpec(
        kind="tests.unit.test_validator_compose:half", params={"value": 0.25, "timeout_s": 2}
    )
    built = scorer(domain("d", spec))
    assert built.panels["d"].judges[0].timeout_s == 2.0
    assert (await built.score(rollout())).reward == 0.25
    aliased = Scorer(
        DomainRegistry([domain("d", ValidatorSpec(kind="halves"))]),
        Resources(),
        timeout_s=5.0,
        validator="v",
        plugins={"halves": "tests.unit.test_validator_compose:half"},
    )
    assert (await aliased.score(rollout())).reward == 0.5


class Broken(RuleValidator):
    def check(self, rollout: Rollout) -> Verdict:
        raise InvalidRollout("no reference")


async def test_rule_panels_are_judged_inline_as_they_would_be_awaited() -> None:
    rules = domain("rules", ValidatorSpec(kind="exact"), ValidatorSpec(kind="format"))
    waits = domain("waits", ValidatorSpec(kind="tests.unit.test_validator_compose:half"))
    built = scorer(rules, waits)
    assert built.inline("rules") and built.inline("elsewhere") and not built.inline("waits")
    for text in ("<answer>1</answer>", "<answer>2</answer>", "no tags"):
        one = rollout(domain="rules", completion_text=text)
        assert built.judge_now(one) == await built.judge(one)
    unknown = rollout(domain="elsewhere")
    assert built.judge_now(unknown) == await built.judge(unknown)
    with pytest.raises(ValueError, match="'waits' has validators that wait"):
        built.judge_now(rollout(domain="waits"))


async def test_a_rule_that_raises_is_judged_the_same_inline() -> None:
    panel = Panel(domain(), (judge(Broken()),))
    inline = panel.judge_now(rollout())
    assert inline == await panel.judge(rollout())
    assert (inline.status, inline.error) == (ScoreStatus.INVALID, "j: no reference")


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (ValidatorSpec(kind="nope"), "unknown validator kind 'nope'"),
        (ValidatorSpec(kind="math", params={"tolerance": 1}), "unknown parameters ['tolerance']"),
        (ValidatorSpec(kind="math", params={"extract": "magic"}), "parameter 'extract'"),
        (ValidatorSpec(kind="format", params={"pattern": "("}), "format pattern"),
        (ValidatorSpec(kind="code"), "needs a sandbox"),
        (ValidatorSpec(kind="reward_model"), "needs a `path`"),
        (ValidatorSpec(kind="exact", params={"timeout_s": -1}), "timeout_s"),
        (ValidatorSpec(kind="no.such.module:thing"), "No module named"),
    ],
)
def test_bad_specs_fail_at_build_naming_the_domain(spec: ValidatorSpec, error: str) -> None:
    with pytest.raises(DomainError, match=None) as caught:
        scorer(domain("d", spec))
    assert error in str(caught.value)


def test_every_configured_domain_gets_its_validators() -> None:
    from services.domains import load_registry
    from services.validator.sessions import ShellSession

    class NoSandbox:
        async def run(self, request: SandboxExec, timeout_s: float) -> SandboxResult:
            raise InfraFailure("unused")

    class NoSessions:
        async def open(
            self, name: str, files: Mapping[str, bytes], limits: SandboxLimits
        ) -> ShellSession:
            raise InfraFailure("unused")

    registry = load_registry(REPO / "deploy" / "domains", plugins=False)
    resources = Resources(sandbox=NoSandbox(), sessions=NoSessions())
    built = Scorer(registry, resources, timeout_s=5.0, validator="v", plugins={})
    assert set(built.panels) == set(registry.names())
    assert len(built.panels) >= 200


def scored(status: ScoreStatus, reward: float = 0.0) -> ScoredRollout:
    return ScoredRollout(id="x", rollout=rollout(), status=status, reward=reward)


def test_domain_stats_figures_and_metrics() -> None:
    registry = CollectorRegistry()
    stats = DomainStats(registry)
    for outcome in [
        scored(ScoreStatus.SCORED, 1.0),
        scored(ScoreStatus.SCORED, 0.5),
        scored(ScoreStatus.INFRA_FAILURE),
        scored(ScoreStatus.INVALID),
    ]:
        stats.record("d", outcome.status, outcome.reward, threshold=1.0)
    stats.record("who", ScoreStatus.INVALID, 0.0, threshold=None)
    values = stats.values()
    assert values["domain.d.rollouts"] == 4
    assert values["domain.d.mean_reward"] == 0.75
    assert values["domain.d.pass_rate"] == 0.5
    assert values["domain.d.infra_failure_rate"] == 0.25
    assert values["domain.d.invalid_rate"] == 0.25
    assert values[f"domain.{UNKNOWN}.invalid_rate"] == 1.0
    sample = registry.get_sample_value
    assert sample("temper_validator_rollouts_total", {"domain": "d", "status": "scored"}) == 2
    assert sample("temper_validator_reward_sum", {"domain": "d"}) == 1.5
    assert sample("temper_validator_passed_total", {"domain": "d"}) == 1
    stats.observe_run("math", ScoreStatus.SCORED, 0.001)
    assert sample("temper_validator_runs_total", {"kind": "math", "status": "scored"}) == 1
    # Only outcomes seen are exported; unknown domains share one label.
    assert sample("temper_validator_rollouts_total", {"domain": UNKNOWN, "status": "invalid"}) == 1
    assert (
        sample("temper_validator_rollouts_total", {"domain": UNKNOWN, "status": "scored"}) is None
    )


def test_latency_buckets_hold_what_is_at_or_below_their_bound() -> None:
    registry = CollectorRegistry(auto_describe=True)
    stats = DomainStats(registry)
    for seconds in (0.0001, 0.00011, 100.0):
        stats.observe_run("math", ScoreStatus.SCORED, seconds)
    stats.observe_run("math", ScoreStatus.INFRA_FAILURE, 0.002)

    def bucket(le: str) -> float | None:
        return registry.get_sample_value(
            "temper_validator_seconds_bucket", {"kind": "math", "le": le}
        )

    assert [bucket(le) for le in ("0.0001", "0.0005", "0.005", "60.0", "+Inf")] == [1, 2, 3, 3, 4]
    assert registry.get_sample_value("temper_validator_seconds_count", {"kind": "math"}) == 4
    total = registry.get_sample_value("temper_validator_seconds_sum", {"kind": "math"})
    assert total == pytest.approx(100.00221)
    runs = {"kind": "math", "status": "infra_failure"}
    assert registry.get_sample_value("temper_validator_runs_total", runs) == 1
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        DomainStats(registry)  # one set of these metrics per registry


async def test_installed_validator_plugins_are_found_by_entry_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from importlib.metadata import EntryPoint

    from services.validator import factory

    point = EntryPoint(
        name="halves", value="tests.unit.test_validator_compose:half", group="temper.validators"
    )
    monkeypatch.setattr(
        factory, "entry_points", lambda *, group: [point] if group == point.group else []
    )
    registry = DomainRegistry([domain("d", ValidatorSpec(kind="halves"))])
    built = Scorer(registry, Resources(), timeout_s=5.0, validator="v")
    assert (await built.score(rollout())).reward == 0.5


async def test_a_score_outside_its_range_is_clamped_and_flagged() -> None:
    panel = Panel(domain(), (judge(Fixed(17.0), 0.5, "a"), judge(Fixed(-3.0), 0.5, "b")))
    result = await panel.judge(rollout())
    assert result.status is ScoreStatus.SCORED
    assert result.reward == pytest.approx(0.5)
    assert [(d.score, d.clamped_from) for d in result.details] == [(1.0, 17.0), (0.0, -3.0)]
    assert result.details[0].message.startswith("score 17 outside the range [0, 1], clamped to 1")
    assert [d.name for d in result.clamped()] == ["a", "b"]


async def test_a_score_inside_its_range_is_left_alone_and_unflagged() -> None:
    wide = ScoreRange(-2.0, 2.0)
    result = await Panel(domain(), (judge(Fixed(-1.5), score_range=wide),)).judge(rollout())
    assert (result.reward, result.details[0].clamped_from, result.clamped()) == (-1.5, None, [])


def test_a_rule_validator_out_of_range_is_clamped_inline_too() -> None:
    class Rule(RuleValidator):
        def check(self, rollout: Rollout) -> Verdict:
            return Verdict(5.0)

    result = Panel(domain(), (judge(Rule()),)).judge_now(rollout())
    assert (result.reward, result.details[0].clamped_from) == (1.0, 5.0)


def test_a_built_panel_takes_each_specs_declared_range() -> None:
    specs = (
        ValidatorSpec(kind="math"),
        ValidatorSpec(kind="length", params={"limit": 10}),
        ValidatorSpec(kind=f"{__name__}:half", params={"score_range": [0, 4]}),
    )
    panel = build_panel(domain("d", *specs), Resources(), 5.0, {})
    assert [j.score_range for j in panel.judges] == [
        UNIT,
        ScoreRange(-1.0, 0.0),
        ScoreRange(0.0, 4.0),
    ]
