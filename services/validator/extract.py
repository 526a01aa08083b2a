"""Pull answers, code, citations and tool calls out of a completion.

Everything here is linear in the text (``str.find`` scans, no backtracking
regexes), so a hostile completion cannot stall the event loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal

from services.domains.formats import ANSWER_TAG, TOOL_CALL_TAG

Extract = Literal["tag", "boxed", "auto", "full"]
EXTRACT_MODES: Final[tuple[Extract, ...]] = ("tag", "boxed", "auto", "full")
_BOXED: Final = ("\\boxed{", "\\fbox{")


def tags(text: str, tag: str) -> list[str]:
    """Contents of every complete ``<tag>...</tag>``, in order (stripped)."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    found: list[str] = []
    start = text.find(opening)
    while start >= 0:
        end = text.find(closing, start + len(opening))
        if end < 0:
            break
        found.append(text[start + len(opening) : end].strip())
        start = text.find(opening, end + len(closing))
    return found


def last_tag(text: str, tag: str) -> str | None:
    """Contents of the last complete ``<tag>...</tag>``."""
    end = text.rfind(f"</{tag}>")
    if end < 0:
        return None
    start = text.rfind(f"<{tag}>", 0, end)
    return None if start < 0 else text[start + len(tag) + 2 : end].strip()


def unclosed(text: str, tag: str) -> int:
    """How many ``<tag>`` openings have no closing tag."""
    return max(0, text.count(f"<{tag}>") - text.count(f"</{tag}>"))


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (braces balanced), or ``None``."""
    start = max(text.rfind(marker) for marker in _BOXED)
    if start < 0:
        return None
    opening = text.index("{", start)
    depth = 0
    for index in range(opening, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[opening + 1 : index].strip()
    return None


def answer(text: str, mode: Extract) -> str | None:
    """The final answer: the last ``<answer>`` tag, the last ``\\boxed{}``, or the whole text."""
    if mode == "tag":
        return last_tag(text, ANSWER_TAG)
    if mode == "boxed":
        return last_boxed(text)
    if mode == "full":
        return text.strip()
    found = last_tag(text, ANSWER_TAG)
    return found if found is not None else last_boxed(text)


def code_block(text: str, language: str = "python") -> str | None:
    """The last fenced code block (``language`` or untagged); ``None`` if there is none."""
    end = text.rfind("```")
    start = text.rfind("```", 0, end) if end > 0 else -1
    if start < 0:
        return None
    body = text[start + 3 : end]
    first, newline, rest = body.partition("\n")
    if not newline:
        return None
    if first.strip() not in ("", language, language[:2]):
        return None
    return rest


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One ``<tool_call>`` block: its name and arguments, or why it is malformed."""

    name: str = ""
    arguments: dict[str, Any] | None = None
    error: str = ""


def parse_call(body: str) -> ParsedCall:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as error:
        return ParsedCall(error=f"not JSON: {error}")
    if not isinstance(data, dict):
        return ParsedCall(error="not a JSON object")
    name, arguments = data.get("name"), data.get("arguments")
    if not isinstance(name, str) or not name:
        return ParsedCall(error="no `name` string")
    if isinstance(arguments, str):
        # Some chat templates encode the arguments as a JSON string: accept its object.
        return parse_call(json.dumps({"name": name, "arguments": _object(arguments)}))
    if not isinstance(arguments, dict):
        return ParsedCall(name=name, error="`arguments` is not an object")
    return ParsedCall(name=name, arguments=arguments)


def _object(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


def tool_calls(text: str) -> list[ParsedCall]:
    """Every ``<tool_call>`` block, an unclosed one counting as malformed."""
    calls = [parse_call(body) for body in tags(text, TOOL_CALL_TAG)]
    calls += [ParsedCall(error="unclosed <tool_call>")] * unclosed(text, TOOL_CALL_TAG)
    return calls
