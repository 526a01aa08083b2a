"""Rule validators and the extraction helpers, each on positive and negative cases."""

from __future__ import annotations

import re
from typing import Any

import pytest

from protocol.messages import ChatMessage, FinishReason, Rollout, Task, ToolCall
from protocol.packed import pack_i32
from services.validator import extract
from services.validator.base import InvalidRollout, Verdict
from services.validator.rules import (
    DocNumericQA,
    ExactMatch,
    FormatCheck,
    LengthPenalty,
    MathAnswer,
    ToolCallFormat,
    normalize,
)


def rollout(text: str, metadata: dict[str, Any] | None = None, **fields: Any) -> Rollout:
    tools = fields.pop("tools", [])
    task = Task(
        id="t1",
        domain="d",
        prompt=[ChatMessage(role="user", content="q")],
        tools=tools,
        metadata=metadata if metadata is not None else {"answer": "42"},
    )
    return Rollout(id="t1/0", task=task, sample_index=0, completion_text=text, **fields)


# ---------------------------------------------------------------- extraction


def test_tags_and_last_tag() -> None:
    text = "<answer> 1 </answer> then <answer>2</answer> and <answer>3"
    assert extract.tags(text, "answer") == ["1", "2"]
    assert extract.last_tag(text, "answer") == "2"
    assert extract.unclosed(text, "answer") == 1
    assert extract.last_tag("no tags", "answer") is None


def test_boxed_with_nested_braces() -> None:
    assert extract.last_boxed("x \\boxed{1} y \\boxed{\\frac{3}{4}}") == "\\frac{3}{4}"
    assert extract.last_boxed("\\fbox{7}") == "7"
    assert extract.last_boxed("\\boxed{unclosed") is None
    assert extract.last_boxed("nothing") is None


@pytest.mark.parametrize(
    ("mode", "text", "want"),
    [
        ("tag", "<answer>7</answer> \\boxed{8}", "7"),
        ("boxed", "<answer>7</answer> \\boxed{8}", "8"),
        ("auto", "\\boxed{8}", "8"),
        ("auto", "<answer>7</answer> \\boxed{8}", "7"),
        ("full", "  7 ", "7"),
        ("tag", "\\boxed{8}", None),
    ],
)
def test_answer_modes(mode: extract.Extract, text: str, want: str | None) -> None:
    assert extract.answer(text, mode) == want


def test_code_block_takes_the_last_python_or_plain_block() -> None:
    text = "a\n```python\nx = 1\n```\nb\n```\ny = 2\n```"
    assert extract.code_block(text) == "y = 2\n"
    assert extract.code_block("```py\nz = 3\n```") == "z = 3\n"
    assert extract.code_block("```bash\nls\n```") is None
    assert extract.code_block("def f(): pass") is None


def test_tool_call_parsing() -> None:
    text = (
        '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"2\\"}"}</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "x"'
    )
    calls = extract.tool_calls(text)
    assert [(c.name, c.arguments) for c in calls[:1]] == [("python", {"code": "1"})]
    assert calls[1].error.startswith("not JSON")
    assert calls[2].arguments == {"code": "2"}
    assert "name" in calls[3].error
    assert calls[4].error == "unclosed <tool_call>"


# ---------------------------------------------------------------- exact / math


def test_normalize() -> None:
    assert normalize("  Paris. ") == "paris"
    assert normalize("New\n  York") == "new york"
    assert normalize("\uff21\uff22\uff23", case_sensitive=True) == "ABC"


def test_exact_match_positive_and_negative() -> None:
    judge = ExactMatch(extract="tag")
    meta = {"answer": ["Paris", "paris, france"]}
    assert judge.check(rollout("<answer> paris </answer>", meta)) == Verdict(1.0, "match")
    assert judge.check(rollout("<answer>Paris, France</answer>", meta)).score == 1.0
    assert judge.check(rollout("<answer>Lyon</answer>", meta)).score == 0.0
    assert judge.check(rollout("Paris", meta)).message.startswith("no answer found")
    strict = ExactMatch(extract="tag", case_sensitive=True, normalized=False)
    assert strict.check(rollout("<answer>paris</answer>", meta)).score == 0.0


def test_math_answer_positive_and_negative() -> None:
    judge = MathAnswer(extract="auto")
    assert judge.check(rollout("so \\boxed{42}", {"answer": "42"})).score == 1.0
    assert judge.check(rollout("<answer>0.75</answer>", {"answer": "3/4"})).score == 1.0
    assert judge.check(rollout("<answer>1,250</answer>", {"answer": "1250"})).score == 1.0
    assert judge.check(rollout("<answer>45%</answer>", {"answer": "0.45"})).score == 1.0
    assert judge.check(rollout("<answer>41</answer>", {"answer": "42"})).score == 0.0
    assert "not a number" in judge.check(rollout("<answer>lots</answer>")).message
    assert judge.check(rollout("42")).message.startswith("no answer found")


def test_math_answer_tolerance() -> None:
    loose = MathAnswer(extract="tag", rel_tol=0.01)
    assert loose.check(rollout("<answer>3.14</answer>", {"answer": "3.14159"})).score == 1.0
    assert (
        MathAnswer(extract="tag")
        .check(rollout("<answer>3.14</answer>", {"answer": "3.14159"}))
        .score
        == 0.0
    )


def test_missing_or_bad_reference_is_invalid_not_zero() -> None:
    with pytest.raises(InvalidRollout, match="answer"):
        MathAnswer().check(rollout("<answer>1</answer>", {}))
    with pytest.raises(InvalidRollout, match="not a number"):
        MathAnswer().check(rollout("<answer>1</answer>", {"answer": "many"}))
    with pytest.raises(InvalidRollout):
        ExactMatch().check(rollout("<answer>1</answer>", {"answer": {"a": 1}}))


# ---------------------------------------------------------------- format / tool calls / length


def test_format_check() -> None:
    shape = FormatCheck(pattern=re.compile(r"\s*<answer>\d+</answer>\s*"), fullmatch=True)
    assert shape.check(rollout(" <answer>7</answer>\n")).score == 1.0
    assert shape.check(rollout("The answer: <answer>7</answer>")).score == 0.0
    tags = FormatCheck(required_tags=("answer", "cite"))
    assert tags.check(rollout("<cite>x</cite><answer>1</answer>")).score == 1.0
    assert "no complete <cite>" in tags.check(rollout("<answer>1</answer>")).message
    assert "unclosed" in tags.check(rollout("<cite>x</cite><answer>1</answer><cite>")).message
    assert FormatCheck(boxed=True).check(rollout("\\boxed{1}")).score == 1.0
    assert FormatCheck(boxed=True).check(rollout("1")).score == 0.0


def test_tool_call_format_from_text() -> None:
    judge = ToolCallFormat(min_calls=1)
    good = '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
    assert judge.check(rollout(good, tools=["python"])) == Verdict(1.0, "1/1 calls well formed")
    half = good + '<tool_call>{"name": "shell", "arguments": {}}</tool_call>'
    assert judge.check(rollout(half, tools=["python"])).score == 0.5
    assert judge.check(rollout("<tool_call>{oops}</tool_call>", tools=["python"])).score == 0.0
    assert judge.check(rollout("no calls at all", tools=["python"])).score == 0.0
    assert ToolCallFormat(min_calls=0).check(rollout("no calls at all")).score == 1.0


def test_tool_call_format_from_recorded_calls() -> None:
    calls = [ToolCall(turn=0, name="python", arguments='{"code": "1"}')]
    judge = ToolCallFormat()
    assert judge.check(rollout("", tools=["python"], tool_calls=calls)).score == 1.0
    wrong = [ToolCall(turn=0, name="python", arguments="[1, 2]")]
    assert judge.check(rollout("", tools=["python"], tool_calls=wrong)).score == 0.0


def test_length_penalty() -> None:
    judge = LengthPenalty(limit=10, hard=20)
    assert judge.check(rollout("x" * 10)).score == 0.0
    assert judge.check(rollout("x" * 15)).score == -0.5
    assert judge.check(rollout("x" * 50)).score == -1.0
    cut = rollout("x" * 5, finish_reason=FinishReason.LENGTH)
    assert judge.check(cut).score == -1.0
    assert LengthPenalty(limit=10, hard=20, truncated=0.25).check(cut).score == -0.25


def test_length_penalty_in_tokens() -> None:
    judge = LengthPenalty(limit=4, hard=8, unit="tokens")
    tokens = dict(tokens=pack_i32(range(10)), prompt_len=2, logprobs=bytes(32), loss_mask=bytes(8))
    assert judge.check(rollout("", **tokens)).score == -1.0  # 8 completion tokens
    assert (
        judge.check(
            rollout(
                "", tokens=pack_i32(range(6)), prompt_len=2, logprobs=bytes(16), loss_mask=bytes(4)
            )
        ).score
        == 0.0
    )


# ---------------------------------------------------------------- document numeric QA

DOCUMENT = (
    "Acme Inc. - quarterly results (USD thousands)\n\n"
    "Line item | Q1 2023 | Q2 2023\n"
    "Revenue | 1,000.0 | 1,250.0\n"
    "Net income | 100.0 | -20.5"
)
QA = {"answer": "25.00%", "document": DOCUMENT, "evidence": ["1,000.0", "1,250.0"]}


def test_doc_qa_correct_value_and_verbatim_citation() -> None:
    text = "<cite>Revenue | 1,000.0 | 1,250.0</cite> so <answer>25%</answer>"
    verdict = DocNumericQA().check(rollout(text, QA))
    assert verdict.score == 1.0, verdict.message


def test_doc_qa_value_within_tolerance_only() -> None:
    cite = "<cite>Revenue  |  1,000.0 |\n1,250.0</cite>"  # whitespace is folded
    assert (
        DocNumericQA(rel_tol=0.01).check(rollout(cite + "<answer>25.1%</answer>", QA)).score == 1.0
    )
    assert (
        DocNumericQA(rel_tol=0.001).check(rollout(cite + "<answer>25.1%</answer>", QA)).score == 0.0
    )


@pytest.mark.parametrize(
    ("text", "score", "why"),
    [
        ("<answer>25%</answer>", 0.6, "no citation"),  # right, uncited: less than cited
        ("<cite>Revenue | 1,000.0 | 1,300.0</cite><answer>25%</answer>", 0.6, "0/1 citations"),
        ("<cite>Revenue | 1,000.0</cite><answer>25%</answer>", 0.8, "evidence 0.50"),
        (
            "<cite>Revenue | 1,000.0 | 1,250.0</cite><cite>made up</cite><answer>25%</answer>",
            0.8,
            "1/2 citations",
        ),
        (  # a verbatim quote of something else is padding
            "<cite>Revenue | 1,000.0 | 1,250.0</cite><cite>Net income | 100.0</cite>"
            "<answer>25%</answer>",
            0.8,
            "1 quoting evidence",
        ),
        ("<cite>Revenue | 1,000.0 | 1,250.0</cite><answer>25% or 30%</answer>", 0.0, "2 numbers"),
        ("<cite>Revenue | 1,000.0 | 1,250.0</cite>", 0.0, "no <answer>"),
        ("<cite>Revenue | 1,000.0 | 1,250.0</cite><answer>30%</answer>", 0.0, "0/1 values"),
    ],
)
def test_doc_qa_negative_cases(text: str, score: float, why: str) -> None:
    verdict = DocNumericQA().check(rollout(text, QA))
    assert verdict.score == pytest.approx(score)
    assert why in verdict.message


def test_doc_qa_refuses_a_citation_of_the_whole_document() -> None:
    text = f"<cite>{DOCUMENT}</cite><answer>25%</answer>"
    assert DocNumericQA(max_citation_chars=100).check(rollout(text, QA)).score == 0.6


def test_doc_qa_without_document_is_invalid() -> None:
    with pytest.raises(InvalidRollout, match="document"):
        DocNumericQA().check(rollout("<answer>1</answer>", {"answer": "1"}))
