"""Score ranges: declared per validator, summed per domain, enforced by the learner."""

from __future__ import annotations

import msgspec
import pytest

from protocol.messages import ChatMessage, Rollout, ScoredRollout, Task
from services.domains import Domain, DomainError, Problem, ValidatorSpec, load_registry
from services.domains.ranges import RAW_LOGIT, UNIT, ScoreRange, declared, of_domain
from services.learner.reward_bounds import UNKNOWN_DOMAIN, RewardBounds


class _Source:
    def draw(self, rng: object) -> Problem:
        return Problem(key="k", question="q", metadata={})


def _domain(*specs: ValidatorSpec) -> Domain:
    return Domain(name="d", source=_Source(), validators=specs)


def test_built_in_kinds_declare_their_ranges() -> None:
    assert declared(ValidatorSpec(kind="math")) == UNIT
    assert declared(ValidatorSpec(kind="length")) == ScoreRange(-1.0, 0.0)
    assert declared(ValidatorSpec(kind="reward_model", params={"transform": "raw"})) == RAW_LOGIT
    assert declared(ValidatorSpec(kind="pkg.mod:judge")) == UNIT  # a plugin declares, or [0, 1]
    own = ValidatorSpec(kind="pkg.mod:judge", params={"score_range": [-2, 5]})
    assert declared(own) == ScoreRange(-2.0, 5.0)


@pytest.mark.parametrize("bad", [[1, 0], [0], "0,1", [0, float("inf")], [True, 2]])
def test_a_bad_declared_range_names_the_validator(bad: object) -> None:
    with pytest.raises(DomainError, match="score_range must be"):
        declared(ValidatorSpec(kind="math", name="m", params={"score_range": bad}), "d")


def test_a_domains_range_is_the_weighted_sum_of_its_validators() -> None:
    specs = (
        ValidatorSpec(kind="math", weight=0.9),
        ValidatorSpec(kind="format", weight=0.1),
        ValidatorSpec(kind="length", weight=0.5),
        ValidatorSpec(kind="exact", weight=-0.2),  # a negative weight turns its range over
    )
    allowed = of_domain(_domain(*specs))
    assert (allowed.low, allowed.high) == (pytest.approx(-0.7), pytest.approx(1.0))


def test_every_built_in_domain_has_a_finite_range() -> None:
    for domain in load_registry(None):
        allowed = of_domain(domain)
        assert allowed.low <= 0.0 < allowed.high, domain.name


def _scored(domain: str, reward: float) -> ScoredRollout:
    task = Task(id="t", domain=domain, prompt=[ChatMessage(role="user", content="q")])
    rollout = Rollout(id="t/0", task=task, sample_index=0)
    return ScoredRollout(id="t/0", rollout=rollout, reward=reward)


def test_the_learner_refuses_rewards_outside_their_domains_range() -> None:
    bounds = RewardBounds({"d": ScoreRange(0.0, 1.0)})
    assert bounds.reason(_scored("d", 1.0)) is None
    assert bounds.reason(_scored("d", 1.5)) == "reward 1.5 is outside its range [0, 1] (domain 'd')"
    assert "reward is nan" == bounds.reason(_scored("d", float("nan")))
    unknown = bounds.reason(_scored("other", 3.0))
    assert (
        unknown
        == f"reward 3 is outside an unknown domain's range {UNKNOWN_DOMAIN} (domain 'other')"
    )
    assert bounds.reason(_scored("other", -0.5)) is None


def test_the_learner_loads_the_ranges_of_the_validators_config() -> None:
    bounds = RewardBounds.load(None, plugins=False)
    assert bounds.ranges["arithmetic"] == UNIT
    assert bounds.ranges["math_word_problems"] == ScoreRange(-1.0, 1.0)


def test_a_steps_domain_figures_count_the_top_score_over_the_domains_range() -> None:
    from protocol.packed import pack_f32, pack_i32, pack_u8
    from services.learner.domain_figures import figures

    def item(reward: float, tokens: int) -> ScoredRollout:
        scored = _scored("d", reward)
        rollout = msgspec.structs.replace(
            scored.rollout,
            tokens=pack_i32([1] * (tokens + 1)),
            prompt_len=1,
            logprobs=pack_f32([-1.0] * tokens),
            loss_mask=pack_u8([1] * tokens),
        )
        return msgspec.structs.replace(scored, rollout=rollout)

    bounds = RewardBounds({"d": ScoreRange(-1.0, 1.0)})
    found = figures([item(1.0, 4), item(1.0, 6), item(-1.0, 30), item(0.0, 20)], bounds)["d"]
    assert (found.samples, found.at_top, found.top_len, found.len_mean) == (4, 2, 5.0, 15.0)
    assert found.histogram == (1, 0, 0, 0, 0, 1, 0, 0, 0, 2)
