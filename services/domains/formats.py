"""Answer formats: the domains ask for them, the validators read them."""

from __future__ import annotations

import json
from typing import Final, Literal

AnswerStyle = Literal["tag", "boxed"]
STYLES: Final[tuple[AnswerStyle, ...]] = ("tag", "boxed")

ANSWER_TAG: Final = "answer"
CITE_TAG: Final = "cite"
TOOL_CALL_TAG: Final = "tool_call"

INSTRUCTIONS: Final[dict[AnswerStyle, str]] = {
    "tag": "Reply with the final answer as <answer>...</answer>.",
    "boxed": "Put the final answer in \\boxed{...}.",
}


def answer_style(value: str) -> AnswerStyle:
    return "boxed" if value == "boxed" else "tag"


def answer_text(answer: str, style: AnswerStyle) -> str:
    """How a correct final answer is written in ``style``."""
    if style == "boxed":
        return f"\\boxed{{{answer}}}"
    return f"<{ANSWER_TAG}>{answer}</{ANSWER_TAG}>"


def tool_call_text(name: str, arguments: dict[str, object]) -> str:
    """One tool call as the model writes it: a JSON object with ``name`` and ``arguments``."""
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<{TOOL_CALL_TAG}>{body}</{TOOL_CALL_TAG}>"


def tool_instructions(tools: tuple[str, ...]) -> str:
    names = ", ".join(tools)
    return (
        f"You can call these tools: {names}. To call one, write "
        f'<{TOOL_CALL_TAG}>{{"name": "<tool>", "arguments": {{...}}}}</{TOOL_CALL_TAG}>; '
        'the python tool takes {"code": "..."} and returns what the code prints.'
    )
