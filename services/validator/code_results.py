"""The validator's side of a code run: reading what the harness printed and comparing it
with the expected values, in the validator's own process.

Everything read here was printed in the sandbox, where the candidate could have written
any of it, so nothing here may raise on it or trust it: a line is a claim ("call 3
returned [1, 2]"), parsed by ``ast.literal_eval`` (Python) or ``json.loads`` (C++,
JavaScript), never evaluated, and compared with types held strictly.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Final

#: The prefix of a harness line: ``@@temper-value <index> <value>``.
MARK: Final = "@@temper-value"
#: ASCII digits only (``str.isdigit`` takes "²", which ``int`` refuses), and few of them.
_LINE: Final = re.compile(re.escape(MARK) + r" ([0-9]{1,9}) (.*)", re.DOTALL)
#: Deeper than any expected value; a deeper one is wrong, not a crash of the comparison.
MAX_DEPTH: Final = 100
#: Longer than any expected value's text: a longer one is not parsed (the parser's tree
#: of a 16 MiB line would take gigabytes of the validator's memory).
MAX_VALUE_CHARS: Final = 1 << 18


class Unreadable:
    """A value line that does not parse: the call it claims counts as failed."""

    def __repr__(self) -> str:
        return "<unreadable>"


UNREADABLE: Final = Unreadable()


def returned(stdout: str, total: int, language: str) -> dict[int, object]:
    """The value each call returned, by index in ``range(total)``: only the first line
    for an index counts (a later one cannot replace it), so there are at most ``total``."""
    found: dict[int, object] = {}
    for line in stdout.splitlines():
        match = _LINE.fullmatch(line)
        if match is None:
            continue
        index = int(match[1])
        if index < total and index not in found:
            found[index] = _parse(match[2], language)
    return found


def _parse(text: str, language: str) -> object:
    if len(text) > MAX_VALUE_CHARS:
        return UNREADABLE
    try:
        if language == "python":
            return ast.literal_eval(text)
        return json.loads(text)
    except Exception:  # candidate text: whatever fails to parse is unreadable
        return UNREADABLE


def same(got: object, want: object, depth: int = 0) -> bool:
    """``got == want`` with types held: a bool is not an int, a list is not a tuple, an int
    and a float are the same number only when equal (NaN equals nothing)."""
    if depth > MAX_DEPTH:
        return False
    numbers = type(got) in (int, float) and type(want) in (int, float)  # bool is neither
    if not numbers and type(got) is not type(want):
        return False
    if isinstance(want, list | tuple):
        assert isinstance(got, list | tuple)
        return len(got) == len(want) and all(
            same(g, w, depth + 1) for g, w in zip(got, want, strict=True)
        )
    if isinstance(want, dict):
        assert isinstance(got, dict)
        return got.keys() == want.keys() and all(
            same(got[key], value, depth + 1) for key, value in want.items()
        )
    try:
        return bool(got == want)
    except Exception:  # e.g. sets nested too deep to compare: not equal
        return False
