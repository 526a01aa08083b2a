"""The models' tool-call format, read by the agent loop and by the gateway.

A model calls a tool by writing ``<tool_call>{"name": "python", "arguments": {"code":
"print(1)"}}</tool_call>`` (docs/generator.md); the chat template of the warmed-up
policies teaches it.  A block that does not parse is the model's mistake, not ours.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

TOOL_CALL_START: Final = "<tool_call>"
TOOL_CALL_END: Final = "</tool_call>"
_CALL: Final = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True, kw_only=True)
class ToolCallRequest:
    name: str
    arguments: dict[str, Any]
    raw: str


def parse_tool_call(text: str) -> ToolCallRequest | str:
    """The last tool call in ``text``, or an error message for the model."""
    found = _CALL.findall(text)
    if not found:
        return "no <tool_call>...</tool_call> block found"
    return _parsed(found[-1])


def parse_tool_calls(text: str) -> tuple[str, list[ToolCallRequest]] | None:
    """The text before the first block and every call in ``text``, in order; None when
    there is no block or one of them does not parse (the whole text is then content)."""
    blocks = _CALL.findall(text)
    calls = [_parsed(block) for block in blocks]
    if not calls or any(isinstance(call, str) for call in calls):
        return None
    return text[: text.index(TOOL_CALL_START)], [c for c in calls if not isinstance(c, str)]


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """One tool call as the model writes it."""
    return f"{TOOL_CALL_START}{json.dumps({'name': name, 'arguments': arguments})}{TOOL_CALL_END}"


def _parsed(block: str) -> ToolCallRequest | str:
    raw = block.strip()
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as error:
        return f"tool call is not valid JSON: {error.msg} at char {error.pos}"
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return 'tool call needs an object with a string "name"'
    arguments = body.get("arguments", {})
    if not isinstance(arguments, dict):
        return 'tool call "arguments" must be an object'
    return ToolCallRequest(name=body["name"], arguments=arguments, raw=raw)
