"""Domains: the registry, tasks made from the built-ins, deterministic and disjoint splits."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from protocol.codec import Codec
from protocol.messages import Task
from services.domains import (
    Domain,
    DomainError,
    DomainRegistry,
    Problem,
    UnknownDomain,
    ValidatorSpec,
    load_registry,
)
from services.domains.arithmetic import evaluate
from services.domains.doc_qa import money
from services.domains.python_functions import scored_and_shown
from services.domains.word_problems import decimal_text
from services.validator.numbers import parse_number

BUILTINS = [
    "arithmetic",
    "arithmetic_sum3",
    "arithmetic_sum4",
    "math_word_problems",
    "python_functions",
    "doc_numeric_qa",
    "tool_use",
]
REGISTRY = load_registry(None, plugins=False)


def test_builtin_registry_lookups() -> None:
    assert REGISTRY.names() == BUILTINS
    assert "arithmetic" in REGISTRY and "nope" not in REGISTRY
    assert REGISTRY.get("tool_use").tools == ("python",)
    assert len(REGISTRY) == 7 and [d.name for d in REGISTRY] == BUILTINS
    with pytest.raises(UnknownDomain) as caught:
        REGISTRY.get("nope")
    assert (caught.value.name, caught.value.known) == ("nope", 7)


def test_arithmetic_is_single_digit_addition_with_tagged_answers() -> None:
    domain = REGISTRY.get("arithmetic")
    tasks = domain.make_tasks(50, "train", seed=3)
    for task in tasks:
        system, user = task.prompt
        assert system.role == "system" and "<answer>" in system.content
        a, b = user.content.removesuffix("=").split("+")
        assert len(a) == len(b) == 1
        assert task.metadata["answer"] == str(int(a) + int(b))
        assert task.sampling.max_tokens <= 16 and task.domain == "arithmetic"
    example = domain.examples(1)[0]
    assert example.reference == f"<answer>{example.task.metadata['answer']}</answer>"


@pytest.mark.parametrize("name", BUILTINS)
def test_tasks_are_deterministic_per_seed_and_valid_protocol(name: str) -> None:
    domain = REGISTRY.get(name)
    first, again = domain.make_tasks(8, "train", seed=1), domain.make_tasks(8, "train", seed=1)
    assert first == again
    assert domain.make_tasks(8, "train", seed=2) != first
    codec: Codec[Task] = Codec(Task)
    for index, task in enumerate(first):
        assert codec.decode(codec.encode(task)) == task  # ids are subject tokens, fields valid
        assert task.id == f"{name}-train-1-{index}"
        assert (
            task.metadata["split"] == "train" and "answer" in task.metadata
        ) or "calls" in task.metadata


@pytest.mark.parametrize("name", BUILTINS)
def test_eval_split_is_disjoint_from_train(name: str) -> None:
    domain = REGISTRY.get(name)
    train = {t.metadata["key"] for seed in range(3) for t in domain.make_tasks(60, "train", seed)}
    held_out = {t.metadata["key"] for t in domain.make_tasks(30, "eval", seed=0)}
    assert held_out and train and not held_out & train
    assert domain.make_tasks(5, "eval", seed=0) == domain.make_tasks(5, "eval", seed=0)


def test_a_split_that_cannot_be_filled_says_so() -> None:
    class Single:
        def draw(self, rng: random.Random) -> Problem:
            return Problem(key="only", question="q", metadata={"answer": "1"}, split="train")

    domain = Domain(name="tiny", source=Single(), validators=(ValidatorSpec(kind="exact"),))
    assert len(domain.make_tasks(3, "train")) == 3
    with pytest.raises(DomainError, match="found 0 of 2 eval problems"):
        domain.make_tasks(2, "eval")
    with pytest.raises(ValueError, match="split"):
        domain.make_tasks(1, "test")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"name": "bad name"}, "cannot be a subject token"),
        ({"name": "a.b"}, "cannot be a subject token"),
        ({"validators": ()}, "no validators"),
        ({"eval_fraction": 1.0}, "eval_fraction"),
        ({"tier": 9}, "tier"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"samples": 0}, "samples"),
        ({"validators": (ValidatorSpec(kind="exact", weight=float("inf")),)}, "weight"),
    ],
)
def test_domain_fields_are_checked(fields: dict[str, object], error: str) -> None:
    values: dict[str, object] = {
        "name": "ok",
        "source": REGISTRY.get("arithmetic").source,
        "validators": (ValidatorSpec(kind="exact"),),
    }
    values.update(fields)
    with pytest.raises(DomainError, match=error):
        Domain(**values)  # type: ignore[arg-type]


def test_duplicate_names_are_refused() -> None:
    arithmetic = REGISTRY.get("arithmetic")
    with pytest.raises(DomainError, match="declared twice"):
        DomainRegistry([arithmetic, arithmetic])


def test_long_names_still_make_valid_task_ids() -> None:
    domain = Domain(
        name="x" * 120,
        source=REGISTRY.get("arithmetic").source,
        validators=(ValidatorSpec(kind="exact"),),
    )
    ids = [t.id for t in domain.make_tasks(3)]
    assert len(set(ids)) == 3 and all(len(i) <= 128 for i in ids)


def test_evaluate_respects_precedence() -> None:
    assert evaluate([2, 3, 4], ["+", "*"]) == 14
    assert evaluate([2, 3, 4], ["*", "-"]) == 2
    assert evaluate([9, 3, 2, 5], ["-", "*", "+"]) == 8


def test_word_problem_answers_are_exact_numbers() -> None:
    assert decimal_text(Fraction(1, 8)) == "0.125" and decimal_text(Fraction(300)) == "300"
    domain = REGISTRY.get("math_word_problems")
    for task in domain.make_tasks(100, seed=5):
        assert parse_number(task.metadata["answer"]) is not None, task.metadata


def test_doc_qa_evidence_and_reference_citations_are_in_the_document() -> None:
    assert money(1234567) == "123,456.7" and money(-5) == "-0.5"
    domain = REGISTRY.get("doc_numeric_qa")
    for example in domain.examples(30, seed=2):
        document = example.task.metadata["document"]
        assert document in example.task.prompt[-1].content
        assert all(amount in document for amount in example.task.metadata["evidence"])
        for line in example.reference.splitlines()[:-1]:
            assert line.removeprefix("<cite>").removesuffix("</cite>") in document


def test_python_tasks_carry_tests_and_sandbox_limits() -> None:
    domain = REGISTRY.get("python_functions")
    task = domain.make_tasks(1)[0]
    assert domain.sandbox is not None and domain.sandbox.timeout_s == 5.0
    assert task.metadata["calls"][0].startswith(f"{task.metadata['entry_point']}(")
    assert len(task.metadata["calls"]) == len(task.metadata["expected"]) == 5
    # The prompt's example is none of the scored calls.
    assert not any(f"{call} ==" in task.prompt[-1].content for call in task.metadata["calls"])
    assert "```python" in task.prompt[0].content


def test_the_prompt_example_is_never_a_scored_input_even_in_a_tiny_space() -> None:
    rng = random.Random(3)
    for _ in range(50):
        cases, shown = scored_and_shown(lambda: rng.randint(1, 3), 20)
        assert shown not in cases and cases  # two values left to score, the third shown
    only, shown = scored_and_shown(lambda: 7, 4)
    assert only == [7, 7, 7, 7] and shown == 7  # one input at all: nothing else to show


def test_a_function_problem_is_built_once_per_key_and_the_same_as_a_fresh_build() -> None:
    domain = load_registry(None).get("python_functions")
    first = domain.problems(300, seed=4)
    again = load_registry(None).get("python_functions").problems(300, seed=4)
    # Equal to what a source that never cached builds, and the same object per key.
    assert first == again
    by_key = {p.key: p for p in first}
    assert all(p is by_key[p.key] for p in first)
    assert len(by_key) < len(first)
