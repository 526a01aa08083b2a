"""reasoning-gym as a domain kind, and its judge, without a server: building domains, bad
parameters, stable and disjoint splits, problem keys, and the judge's statuses."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from protocol.codec import Codec
from protocol.messages import Rollout, Task, rollout_id
from services.domains import ConfigError, Domain, DomainError, load_registry
from services.domains import reasoning_gym as rg
from services.domains.reasoning_gym_keys import problem_key
from services.validator import factory
from services.validator.base import InvalidRollout
from services.validator.reasoning_gym import ReasoningGymScore

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "domains"
TASKS: Codec[Task] = Codec(Task)


def registered() -> list[Domain]:
    return [d for d in load_registry(DEPLOY, plugins=False) if d.kind == "reasoning_gym"]


def build(params: dict[str, Any], name: str = "rg-test") -> Domain:
    return rg.domain(name, params)


def judge(domain: Domain) -> ReasoningGymScore:
    judge = factory.build(domain.validators[0], domain, factory.Resources(), {})
    assert isinstance(judge, ReasoningGymScore)
    return judge


def rollout(task: Task, text: str) -> Rollout:
    return Rollout(id=rollout_id(task.id, 0), task=task, sample_index=0, completion_text=text)


def with_entry(task: Task, **changes: Any) -> Task:
    entry = {**task.metadata[rg.METADATA], **changes}
    return msgspec.structs.replace(task, metadata={**task.metadata, rg.METADATA: entry})


# ---------------------------------------------------------------- the kind


def test_the_kind_builds_a_domain_whose_prompt_asks_for_the_answer_tag() -> None:
    domain = build({"dataset": "basic_arithmetic", "min_terms": 2, "max_terms": 3})
    assert (domain.kind, domain.validators[0].kind) == ("reasoning_gym", "reasoning_gym")
    assert domain.validators[0].params == {"extract": "tag", "max_answer_chars": 1024}
    example = domain.examples(1, "train", seed=0)[0]
    system, user = example.task.prompt
    assert "<answer>...</answer>" in system.content
    entry = example.task.metadata[rg.METADATA]
    assert entry["dataset"] == "basic_arithmetic" and entry["config"] == {
        "max_terms": 3,
        "min_terms": 2,
    }
    answer = example.task.metadata["answer"]
    assert example.reference == f"<answer>{answer}</answer>"
    # The key names the problem by its question, not by the index or the domain.
    assert example.task.metadata["key"] == problem_key(
        "basic_arithmetic", {"question": user.content}
    )
    assert TASKS.decode(TASKS.encode(example.task)) == example.task  # msgpack-safe


def test_the_boxed_style_asks_for_and_references_a_boxed_answer() -> None:
    domain = build({"dataset": "gcd", "style": "boxed"})
    example = domain.examples(1)[0]
    assert "\\boxed" in domain.prompt.system
    assert example.reference == f"\\boxed{{{example.task.metadata['answer']}}}"
    assert domain.validators[0].params["extract"] == "boxed"


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({}, "parameter 'dataset' is required"),
        ({"dataset": "basic_arithmetc"}, "unknown reasoning-gym dataset 'basic_arithmetc'; "),
        ({"dataset": "basic_arithmetic", "min_termz": 2}, "unknown parameters ['min_termz']"),
        ({"dataset": "basic_arithmetic", "min_terms": 5, "max_terms": 2}, "rejects its param"),
        ({"dataset": "string_insertion"}, "runs eval() on the candidate's answer"),
        ({"dataset": "countdown"}, "sympy's parse_expr"),
        ({"dataset": "gcd", "style": "xml"}, "parameter 'style' is 'xml'"),
        ({"dataset": "gcd", "size": 0}, "parameter 'size' is 0"),
        ({"dataset": "word_sequence_reversal", "max_answer_chars": 5}, "over max_answer_chars"),
    ],
)
def test_bad_parameters_name_the_domain_and_the_problem(
    params: dict[str, Any], problem: str
) -> None:
    with pytest.raises(DomainError) as caught:
        build(params, name="rg-bad")
    assert caught.value.domain == "rg-bad"
    assert problem in str(caught.value)


def test_an_unknown_dataset_suggests_close_names() -> None:
    with pytest.raises(DomainError, match="did you mean basic_arithmetic"):
        build({"dataset": "basic_arithmetc"})


def test_a_config_file_with_a_bad_parameter_names_the_file_and_domain(tmp_path: Path) -> None:
    config = tmp_path / "domains.toml"
    config.write_text(
        '[[domain]]\nname = "rg-typo"\nkind = "reasoning_gym"\n'
        'params = { dataset = "chain_sum", max_term = 3 }\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_registry(config, plugins=False)
    message = str(caught.value)
    assert str(config) in message and "rg-typo" in message and "max_term" in message


def test_splits_are_the_same_from_build_to_build() -> None:
    params = {"dataset": "chain_sum", "seed": 3}
    first, second = build(params), build(params)
    for split in ("train", "eval"):
        assert first.make_tasks(20, split, seed=5) == second.make_tasks(20, split, seed=5)
    # Another dataset seed draws other problems.
    other = build({**params, "seed": 4})
    assert other.make_tasks(20, seed=5) != first.make_tasks(20, seed=5)


def test_eval_and_train_share_no_problem() -> None:
    domain = build({"dataset": "gcd"})
    train = {p.key for p in domain.problems(600, "train", seed=1)}
    held_out = {p.key for p in domain.problems(300, "eval", seed=1)}
    assert len(train) > 100 and len(held_out) > 50
    assert not train & held_out
    # A question is one problem whichever domain or dataset seed draws it: another seed's
    # draws meet these held-out questions again, and never in its training split.
    other = build({"dataset": "gcd", "seed": 7}, name="rg-gcd-other")
    assert {p.key for p in other.problems(300, "eval", seed=1)} & held_out
    assert not {p.key for p in other.problems(600, "train", seed=1)} & held_out


def test_every_registered_reasoning_gym_domain_builds_and_serves_both_splits() -> None:
    domains = registered()
    assert len(domains) >= 50
    assert {d.validators[0].kind for d in domains} == {"reasoning_gym"}
    for domain in domains:
        assert domain.make_tasks(1, "train") and domain.make_tasks(1, "eval"), domain.name


# ---------------------------------------------------------------- the judge


def test_the_judge_scores_the_reference_1_and_a_wrong_answer_less() -> None:
    domain = build({"dataset": "basic_arithmetic"})
    check = judge(domain).check
    for example in domain.examples(5, "eval", seed=2):
        task = example.task
        assert check(rollout(task, example.reference)).score == 1.0
        wrong = f"<answer>{task.metadata['answer']}1</answer>"
        assert check(rollout(task, wrong)).score < 1.0
        assert check(rollout(task, str(task.metadata["answer"]))).message.startswith("no answer")


def test_an_answer_over_the_limit_is_not_read() -> None:
    domain = build({"dataset": "gcd", "max_answer_chars": 8})
    example = domain.examples(1)[0]
    verdict = judge(domain).check(rollout(example.task, "<answer>" + "1 " * 50 + "</answer>"))
    assert verdict.score == 0.0 and "over the 8 read" in verdict.message


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"digest": "0" * 24}, "is not the task's question"),
        ({"dataset": "string_insertion"}, "is refused"),
        ({"dataset": "no_such_dataset"}, "unknown reasoning-gym dataset"),
        ({"index": 10**7}, "out of range"),
        ({"seed": "zero"}, "'seed'] is 'zero', not a int"),
        ({"config": {"min_termz": 1}}, "unknown parameters ['min_termz']"),
    ],
)
def test_a_task_whose_entry_cannot_be_rebuilt_is_invalid(
    change: dict[str, Any], problem: str
) -> None:
    domain = build({"dataset": "chain_sum"})
    example = domain.examples(1)[0]
    with pytest.raises(InvalidRollout) as caught:
        judge(domain).check(rollout(with_entry(example.task, **change), example.reference))
    assert problem in str(caught.value)


def test_a_task_without_the_entry_is_invalid() -> None:
    domain = build({"dataset": "chain_sum"})
    task = domain.make_tasks(1)[0]
    bare = msgspec.structs.replace(task, metadata={"answer": task.metadata["answer"]})
    with pytest.raises(InvalidRollout, match="reasoning_gym"):
        judge(domain).check(rollout(bare, "<answer>1</answer>"))


def test_a_scorer_that_raises_on_the_answer_scores_it_0() -> None:
    # prime_factorization's scorer parses each factor with int(): letters make it raise.
    domain = build({"dataset": "prime_factorization"})
    example = domain.examples(1)[0]
    verdict = judge(domain).check(rollout(example.task, "<answer>a x b</answer>"))
    assert verdict.score == 0.0 and "the scorer refused the answer: ValueError" in verdict.message
    assert judge(domain).check(rollout(example.task, example.reference)).score == 1.0


def _dataset_class(name: str) -> type:
    return rg.registry()[name][0]


def test_a_scorer_that_fails_on_its_own_answer_makes_the_task_invalid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    domain = build({"dataset": "chain_sum"})
    example = domain.examples(1)[0]

    def broken(self: Any, answer: str | None, entry: dict[str, Any]) -> float:
        raise KeyError("metadata")

    # A fault injected at the boundary: reasoning-gym's own scorer.
    monkeypatch.setattr(_dataset_class("chain_sum"), "score_answer", broken)
    with pytest.raises(InvalidRollout, match="fails on the entry's own answer"):
        judge(domain).check(rollout(example.task, example.reference))


@pytest.mark.parametrize(
    ("given", "score", "note"),
    [(3.0, 1.0, "clamped"), (-0.5, 0.0, "clamped"), (1 + 1e-15, 1.0, ""), (0.25, 0.25, "")],
)
def test_scores_are_clamped_into_0_1(
    monkeypatch: pytest.MonkeyPatch, given: float, score: float, note: str
) -> None:
    domain = build({"dataset": "chain_sum"})
    example = domain.examples(1)[0]
    monkeypatch.setattr(_dataset_class("chain_sum"), "score_answer", lambda *a: given)
    verdict = judge(domain).check(rollout(example.task, example.reference))
    assert verdict.score == score
    assert (note in verdict.message) if note else "clamped" not in verdict.message


@pytest.mark.parametrize("given", [None, "high", float("nan")])
def test_a_score_that_is_not_a_number_makes_the_task_invalid(
    monkeypatch: pytest.MonkeyPatch, given: Any
) -> None:
    domain = build({"dataset": "chain_sum"})
    example = domain.examples(1)[0]
    monkeypatch.setattr(_dataset_class("chain_sum"), "score_answer", lambda *a: given)
    with pytest.raises(InvalidRollout, match="scorer returned"):
        judge(domain).check(rollout(example.task, example.reference))


# ---------------------------------------------------------------- keys


def entry(question: str, **metadata: Any) -> dict[str, Any]:
    """An entry in reasoning-gym's shape: question, answer, metadata."""
    return {"question": question, "answer": "", "metadata": metadata}


@pytest.mark.parametrize(
    ("dataset", "one", "other"),
    [
        ("products", {"expression": "8 * 2 * 31"}, {"expression": "31 * 2 * 8"}),
        ("gcd", {"numbers": [28, 21]}, {"numbers": [21, 28]}),
        ("lcm", {"numbers": [98, 54]}, {"numbers": [54, 98]}),
        ("chain_sum", {"expression": "4 - 1 + 7 - 3"}, {"expression": "7 - 3 + 4 - 1"}),
        ("decimal_chain_sum", {"expression": "1.5 + 5.720"}, {"expression": "5.72 + 1.50"}),
        (
            "complex_arithmetic",
            {"num1": (3.0, -9.0), "num2": (-2.0, 6.0), "operation": "*"},
            {"num1": (-2.0, 6.0), "num2": (3.0, -9.0), "operation": "*"},
        ),
    ],
)
def test_operands_in_another_order_are_the_same_problem(
    dataset: str, one: dict[str, Any], other: dict[str, Any]
) -> None:
    assert problem_key(dataset, entry("as written", **one)) == problem_key(
        dataset, entry("written otherwise", **other)
    )


@pytest.mark.parametrize(
    ("dataset", "one", "other"),
    [
        ("chain_sum", {"expression": "4 - 1"}, {"expression": "1 - 4"}),
        (
            "complex_arithmetic",
            {"num1": (3.0, -9.0), "num2": (-2.0, 6.0), "operation": "/"},
            {"num1": (-2.0, 6.0), "num2": (3.0, -9.0), "operation": "/"},
        ),
        ("products", {"expression": "8 * 2"}, {"expression": "8 * 3"}),
    ],
)
def test_operands_that_do_not_commute_stay_two_problems(
    dataset: str, one: dict[str, Any], other: dict[str, Any]
) -> None:
    assert problem_key(dataset, entry("q", **one)) != problem_key(dataset, entry("q", **other))


def test_an_entry_of_an_unknown_shape_is_keyed_by_its_question() -> None:
    odd = entry("What is 4 - -1?", expression="4 - -1")
    assert problem_key("chain_sum", odd) == problem_key("chain_sum", entry("What is 4 - -1?"))
    assert problem_key("chain_sum", odd) != problem_key("chain_sum", entry("What is -1 + 4?"))


def test_no_registered_scorer_changes_the_entry_it_judges_by() -> None:
    """The judge shares one built entry among the rollouts of a task."""
    for domain in registered():
        ref = rg.EntryRef.from_metadata(domain.make_tasks(1)[0].metadata[rg.METADATA])
        dataset = rg.create(ref.dataset)
        entry, untouched = dataset[ref.index], dataset[ref.index]
        for answer in ("", "0", "x", "[1, 2]", "a b c", str(entry["answer"]) + " 1", "-1e9"):
            with contextlib.suppress(Exception):
                dataset.score_answer(answer, entry)
        assert entry == untouched, domain.name
