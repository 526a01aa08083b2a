"""The feeder asks a trained problem in a new spelling each epoch.  A policy that could
meet a held-out problem that way would be scored on what it was trained on: every
spelling the feeder asks must stay a training problem, never the wording or the key of a
held-out one, and its reference answer must stay the problem's own (a respelling that
moved the answer would reward the wrong number)."""

from __future__ import annotations

from services.domains import load_registry
from services.domains.arithmetic import canonical, evaluate, parsed
from services.feeder.dataset import Dataset


def test_no_respelling_reaches_a_heldout_problem() -> None:
    domain = load_registry(None, plugins=False).get("arithmetic_sum4")
    heldout = domain.problems(2_000, "eval", seed=0)
    held_keys = {p.key for p in heldout}
    held_questions = {p.question for p in heldout}
    dataset = Dataset.of(domain, 2_048, seed=0)
    asked = [dataset.spelling(i, epoch) for epoch in range(20) for i in dataset.order(epoch)]
    assert len({p.question for p in asked}) > 3 * len(dataset.problems)
    for problem in asked:
        operands, operators = parsed(problem.question)
        assert f"arith:{canonical(operands, operators)}" == problem.key
        assert problem.key not in held_keys and problem.question not in held_questions
        assert domain.split_of(problem) == "train"
        assert str(evaluate(operands, operators)) == problem.metadata["answer"]
