"""The functions of the ``cpp_functions`` and ``js_functions`` domains.

Each has a Python reference, which computes the tests' expected values here, and a
C++ and a JavaScript reference, the solutions handed out as the problem's reference
(a test checks that they score 1.0 in the real sandbox).  ``{k}`` is the variant's
parameter, as in :mod:`services.domains.python_bank`.  Values are ints, booleans,
strings of lowercase letters and spaces, and lists of ints: each language writes them
as literals and compares them with ``==`` (C++) or through ``JSON.stringify`` (JS).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

Args = tuple[Any, ...]


@dataclass(frozen=True)
class CompiledSpec:
    name: str
    description: str
    cpp_signature: str
    js_signature: str
    python: Callable[..., Any]
    cpp: str
    js: str
    inputs: Callable[[random.Random], Args]
    variants: tuple[int, ...] = (2, 3, 4, 5)


def _ints(rng: random.Random) -> Args:
    return ([rng.randint(-20, 20) for _ in range(rng.randint(0, 9))],)


def _sentence(rng: random.Random) -> Args:
    words = [
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 6)))
        for _ in range(rng.randint(0, 5))
    ]
    return (" ".join(words),)


def _natural(rng: random.Random) -> Args:
    return (rng.randint(0, 100_000),)


def _longest_run(values: list[int], k: int) -> int:
    best = run = 0
    for index, value in enumerate(values):
        run = run + 1 if index and abs(value - values[index - 1]) <= k else 1
        best = max(best, run)
    return best


def _digit_sum(n: int, k: int) -> int:
    total = 0
    while n:
        n, digit = divmod(n, k + 6)
        total += digit
    return total


def _shift(text: str, k: int) -> str:
    return "".join(
        chr((ord(c) - 97 + k) % 26 + 97) if c in string.ascii_lowercase else c for c in text
    )


SPECS: Final[tuple[CompiledSpec, ...]] = (
    CompiledSpec(
        name="sum_multiples",
        description="the sum of the elements of `values` that are multiples of {k}",
        cpp_signature="int sum_multiples(std::vector<int> values)",
        js_signature="function sum_multiples(values)",
        python=lambda values, k: sum(v for v in values if v % k == 0),
        cpp=(
            "int sum_multiples(std::vector<int> values) {\n"
            "    int total = 0;\n"
            "    for (int v : values) if (v % {k} == 0) total += v;\n"
            "    return total;\n}\n"
        ),
        js=(
            "function sum_multiples(values) {\n"
            "    return values.filter((v) => v % {k} === 0).reduce((a, b) => a + b, 0);\n}\n"
        ),
        inputs=_ints,
    ),
    CompiledSpec(
        name="longest_run",
        description=(
            "the length of the longest run of consecutive elements of `values` in which "
            "neighbours differ by at most {k} (0 for an empty list)"
        ),
        cpp_signature="int longest_run(std::vector<int> values)",
        js_signature="function longest_run(values)",
        python=_longest_run,
        cpp=(
            "int longest_run(std::vector<int> values) {\n"
            "    int best = 0, run = 0;\n"
            "    for (size_t i = 0; i < values.size(); ++i) {\n"
            "        run = (i > 0 && std::abs(values[i] - values[i - 1]) <= {k}) ? run + 1 : 1;\n"
            "        best = std::max(best, run);\n"
            "    }\n"
            "    return best;\n}\n"
        ),
        js=(
            "function longest_run(values) {\n"
            "    let best = 0, run = 0;\n"
            "    values.forEach((v, i) => {\n"
            "        run = i > 0 && Math.abs(v - values[i - 1]) <= {k} ? run + 1 : 1;\n"
            "        best = Math.max(best, run);\n"
            "    });\n"
            "    return best;\n}\n"
        ),
        inputs=_ints,
    ),
    CompiledSpec(
        name="running_max",
        description=(
            "the list whose i-th element is the largest of the first i + 1 elements of "
            "`values`, each plus {k}"
        ),
        cpp_signature="std::vector<int> running_max(std::vector<int> values)",
        js_signature="function running_max(values)",
        python=lambda values, k: [max(values[: i + 1]) + k for i in range(len(values))],
        cpp=(
            "std::vector<int> running_max(std::vector<int> values) {\n"
            "    std::vector<int> out;\n"
            "    for (size_t i = 0; i < values.size(); ++i) {\n"
            "        int top = i ? std::max(out.back() - {k}, values[i]) : values[i];\n"
            "        out.push_back(top + {k});\n"
            "    }\n"
            "    return out;\n}\n"
        ),
        js=(
            "function running_max(values) {\n"
            "    let top = -Infinity;\n"
            "    return values.map((v) => (top = Math.max(top, v)) + {k});\n}\n"
        ),
        inputs=_ints,
    ),
    CompiledSpec(
        name="digit_sum",
        description="the sum of the digits of `n` (n >= 0) written in base {k} + 6",
        cpp_signature="int digit_sum(int n)",
        js_signature="function digit_sum(n)",
        python=_digit_sum,
        cpp=(
            "int digit_sum(int n) {\n"
            "    int total = 0;\n"
            "    for (; n > 0; n /= {k} + 6) total += n % ({k} + 6);\n"
            "    return total;\n}\n"
        ),
        js=(
            "function digit_sum(n) {\n"
            "    let total = 0;\n"
            "    for (; n > 0; n = Math.floor(n / ({k} + 6))) total += n % ({k} + 6);\n"
            "    return total;\n}\n"
        ),
        inputs=_natural,
    ),
    CompiledSpec(
        name="shift_letters",
        description=(
            "`text` with every lowercase letter moved {k} places forward in the alphabet "
            "(z wraps to a), other characters unchanged"
        ),
        cpp_signature="std::string shift_letters(std::string text)",
        js_signature="function shift_letters(text)",
        python=_shift,
        cpp=(
            "std::string shift_letters(std::string text) {\n"
            "    for (char& c : text) if (c >= 'a' && c <= 'z') c = 'a' + (c - 'a' + {k}) % 26;\n"
            "    return text;\n}\n"
        ),
        js=(
            "function shift_letters(text) {\n"
            "    return text.replace(/[a-z]/g, (c) =>\n"
            "        String.fromCharCode(((c.charCodeAt(0) - 97 + {k}) % 26) + 97));\n}\n"
        ),
        inputs=_sentence,
    ),
    CompiledSpec(
        name="has_long_word",
        description="whether `text` has a word (split on spaces) of at least {k} letters",
        cpp_signature="bool has_long_word(std::string text)",
        js_signature="function has_long_word(text)",
        python=lambda text, k: any(len(word) >= k for word in text.split(" ")),
        cpp=(
            "bool has_long_word(std::string text) {\n"
            "    std::istringstream words(text);\n"
            "    std::string word;\n"
            "    while (words >> word) if (word.size() >= {k}) return true;\n"
            "    return false;\n}\n"
        ),
        js=(
            "function has_long_word(text) {\n"
            "    return text.split(' ').some((word) => word.length >= {k});\n}\n"
        ),
        inputs=_sentence,
    ),
)


def cpp_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return f'std::string("{value}")'
    return "std::vector<int>{" + ", ".join(str(v) for v in value) + "}"


def js_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, int):
        return str(value)
    return "[" + ", ".join(str(v) for v in value) + "]"


def call_expression(language: str, name: str, args: Args) -> str:
    """The function called on ``args``, in ``language``."""
    literal = cpp_literal if language == "cpp" else js_literal
    return f"{name}({', '.join(literal(a) for a in args)})"


def test_expression(language: str, name: str, args: Args, expected: Any) -> str:
    """How the prompt shows an example: the call, and the value it gives."""
    literal = cpp_literal if language == "cpp" else js_literal
    return f"{call_expression(language, name, args)} == {literal(expected)}"
