"""The held-out set of the learning demo and what one evaluation reports."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from protocol.messages import ChatMessage, Rollout, ScoredRollout, ScoreStatus, Segment, Task
from protocol.packed import pack_f32, pack_i32, pack_u8
from services.domains import Domain, DomainError, Problem, ValidatorSpec, load_registry
from services.evaluation.heldout import (
    EVAL_TIER,
    MACRO,
    Evaluation,
    EvaluationRound,
    HeldoutSet,
    macro_average,
    pass_at_k,
)


def test_the_demo_split_holds_out_problems_not_spellings() -> None:
    domain = load_registry(None).get("arithmetic_sum3")
    heldout = HeldoutSet.of(domain)
    keys = {p.key for p in heldout.problems}
    drawn = domain.problems(20_000, split="train", seed=3)
    trained = {p.key for p in drawn}
    # a+b+c is the problem whatever the order: 220 multisets of three digits, each once.
    assert len(keys) == len(heldout.problems) > 25
    assert not keys & trained and len(trained | keys) == 220
    operands = {tuple(sorted(p.question.split("+"))) for p in drawn}
    assert not any(tuple(sorted(p.question.split("+"))) in operands for p in heldout.problems)
    # No constant answer does well: chance is the most common sum's share.
    assert 0.05 < heldout.chance < 0.2


@dataclass
class CountingSource:
    """Problem ``i`` on the i-th draw: every draw is a new problem, so a split never ends."""

    draws: int = 0

    def draw(self, rng: random.Random) -> Problem:
        self.draws += 1
        return Problem(key=f"p{self.draws:06d}", question=str(self.draws), metadata={})


def test_a_large_split_is_drawn_only_until_the_limit_and_a_small_one_whole() -> None:
    source = CountingSource()
    domain = Domain(name="many", source=source, validators=(ValidatorSpec(kind="exact"),))
    heldout = HeldoutSet.of(domain, limit=40)
    assert len(heldout.problems) == 40
    # About limit / eval_fraction draws, not 25 times as many.
    assert source.draws < 40 / domain.eval_fraction * 3
    keys = [p.key for p in heldout.problems]
    assert keys == sorted(keys) and len(set(keys)) == 40
    # A split smaller than the limit is taken whole (the python bank's 22 keys).
    small = load_registry(None).get("python_functions")
    assert len(HeldoutSet.of(small).problems) == 22


def test_an_empty_eval_split_is_an_error_naming_the_domain() -> None:
    train_only = Domain(
        name="train_only",
        source=CountingSource(),
        validators=(ValidatorSpec(kind="exact"),),
        eval_fraction=0.0,
    )
    with pytest.raises(DomainError, match=r"'train_only'.*eval split is empty"):
        HeldoutSet.of(train_only, limit=2)


def test_eval_tasks_are_greedy_and_sampled_at_the_eval_tier() -> None:
    heldout = HeldoutSet.of(load_registry(None).get("arithmetic_sum3"), limit=3)
    tasks = heldout.tasks("ev1", samples=4)
    assert [t.id for t in tasks] == [
        "ev1-0-g",
        "ev1-0-s",
        "ev1-1-g",
        "ev1-1-s",
        "ev1-2-g",
        "ev1-2-s",
    ]
    assert {t.tier for t in tasks} == {EVAL_TIER}
    assert all(t.metadata["split"] == "eval" for t in tasks)
    greedy, sampled = tasks[0], tasks[1]
    assert (greedy.n, greedy.sampling.temperature) == (1, 0.0)
    assert (sampled.n, sampled.sampling.temperature) == (4, 1.0)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [(4, 0, 4, 0.0), (4, 4, 1, 1.0), (4, 1, 1, 0.25), (4, 1, 2, 0.5), (5, 2, 2, 1 - 3 / 10)],
)
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int, expected: float) -> None:
    assert math.isclose(pass_at_k(n, c, k), expected)


def _scored(
    task_id: str, index: int, reward: float, version: int = 3, domain: str = "arithmetic_sum3"
) -> ScoredRollout:
    task = Task(id=task_id, domain=domain, prompt=[ChatMessage(role="user", content="q")])
    rollout = Rollout(
        id=f"{task_id}/{index}",
        task=task,
        sample_index=index,
        tokens=pack_i32([1, 2]),
        prompt_len=1,
        logprobs=pack_f32([-0.1]),
        loss_mask=pack_u8([1]),
        segments=[Segment(start=0, end=1, version=version)],
    )
    return ScoredRollout(id=rollout.id, rollout=rollout, reward=reward)


def test_an_evaluation_reports_greedy_sampled_and_pass_at_k() -> None:
    heldout = HeldoutSet.of(load_registry(None).get("arithmetic_sum3"), limit=2)
    run = Evaluation(prefix="ev", heldout=heldout, samples=2, elapsed_s=12.3)
    for item in [
        _scored("ev-0-g", 0, 1.0),
        _scored("ev-1-g", 0, 0.0),
        _scored("ev-0-s", 0, 1.0),
        _scored("ev-0-s", 1, 0.0),
        _scored("ev-1-s", 0, 0.0),
        _scored("other-1-g", 0, 1.0),  # another evaluation's: ignored
    ]:
        run.add(item)
    assert not run.done()
    failed = _scored("ev-1-s", 1, 0.0)
    run.add(ScoredRollout(id=failed.id, rollout=failed.rollout, status=ScoreStatus.INFRA_FAILURE))
    assert run.done()
    result = run.result()
    assert result["greedy_accuracy"] == 0.5 and result["problems"] == 2
    assert result["sampled_accuracy"] == pytest.approx(1 / 3) and result["failed"] == 1
    assert result["pass_at_2"] == pytest.approx((1.0 + 0.0) / 2)
    assert result["version"] == 3 and result["elapsed_s"] == 12.3


def test_a_round_reports_each_domain_and_their_macro_average() -> None:
    """Two domains of different sizes: the macro average counts each domain the same."""
    registry = load_registry(None)
    sets = [
        HeldoutSet.of(registry.get("arithmetic_sum3"), limit=3),
        HeldoutSet.of(registry.get("arithmetic"), limit=1),
    ]
    evaluations = tuple(
        Evaluation(prefix=f"r-1-{i}", heldout=h, samples=0, elapsed_s=5.0)
        for i, h in enumerate(sets)
    )
    round_ = EvaluationRound(number=1, evaluations=evaluations)
    for item in [
        _scored("r-1-0-0-g", 0, 1.0),
        _scored("r-1-0-1-g", 0, 0.0),
        _scored("r-1-0-2-g", 0, 0.0, version=4),
        # Another domain's rollout under this prefix is not this domain's.
        _scored("r-1-0-2-g", 0, 1.0, domain="arithmetic"),
    ]:
        round_.add(item)
    assert not round_.done()
    round_.add(_scored("r-1-1-0-g", 0, 1.0, domain="arithmetic"))
    assert round_.done() and round_.version() == 3
    lines = round_.results()
    assert [(x["domain"], x["greedy_accuracy"], x["evaluation"]) for x in lines] == [
        ("arithmetic_sum3", pytest.approx(1 / 3), 1),
        ("arithmetic", 1.0, 1),
    ]
    macro = macro_average(lines, round_.version())
    assert macro["domain"] == MACRO and macro["domains"] == ["arithmetic_sum3", "arithmetic"]
    assert macro["greedy_accuracy"] == pytest.approx((1 / 3 + 1.0) / 2)
    assert macro["problems"] == 4 and macro["version"] == 3
    report = round_.tier_report("v3")
    assert set(report["domains"]) == {"arithmetic_sum3", "arithmetic"}
