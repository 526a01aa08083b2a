"""The functions of the ``python_functions`` domains: description, reference code, inputs.

``{k}`` in a description or reference is the variant's parameter (a shift, a base,
a chunk size).  Functions without a natural parameter use the variant only to pick
a different set of test inputs.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

Args = tuple[Any, ...]


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    category: str
    difficulty: int
    signature: str
    description: str
    reference: str
    inputs: Callable[[random.Random, int], Args]
    variants: tuple[int, ...] = (0, 1, 2, 3, 4)


def _word(rng: random.Random, low: int = 1, high: int = 7) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(low, high)))


def _sentence(rng: random.Random, _: int = 0) -> Args:
    return (" ".join(_word(rng) for _ in range(rng.randint(0, 6))),)


def _ints(rng: random.Random, _: int = 0) -> Args:
    return ([rng.randint(-20, 20) for _ in range(rng.randint(0, 9))],)


def _natural(rng: random.Random, _: int = 0) -> Args:
    return (rng.randint(0, 10_000),)


def _small(rng: random.Random, _: int = 0) -> Args:
    return (rng.randint(1, 30),)


def _mapping(rng: random.Random, _: int = 0) -> Args:
    keys = rng.sample(string.ascii_lowercase, rng.randint(1, 6))
    return ({key: rng.randint(-9, 99) for key in keys},)


def _two_mappings(rng: random.Random, _: int = 0) -> Args:
    return _mapping(rng) + _mapping(rng)


def _pair(rng: random.Random, _: int = 0) -> Args:
    return (rng.randint(0, 500), rng.randint(1, 500))


def _palindrome(rng: random.Random, _: int = 0) -> Args:
    word = _word(rng, 0, 5)
    if rng.random() < 0.5:
        word = word + word[::-1]
    return (word.capitalize() + rng.choice(("", "!", " .")),)


def _runs(rng: random.Random, _: int = 0) -> Args:
    return ("".join(rng.choice("ab") * rng.randint(1, 4) for _ in range(rng.randint(0, 5))),)


def _nested(rng: random.Random, _: int = 0) -> Args:
    return ([_ints(rng)[0][:3] if rng.random() < 0.6 else rng.randint(0, 9) for _ in range(4)],)


SPECS: Final[tuple[FunctionSpec, ...]] = (
    FunctionSpec(
        "reverse_words", "strings", 1, "def reverse_words(text: str) -> str",
        "return the words of `text` (split on whitespace) in reverse order, joined by one space",
        "def reverse_words(text):\n    return ' '.join(reversed(text.split()))\n", _sentence,
    ),
    FunctionSpec(
        "count_vowels", "strings", 1, "def count_vowels(text: str) -> int",
        "return how many characters of `text` are vowels (a, e, i, o, u, either case)",
        "def count_vowels(text):\n    return sum(c in 'aeiouAEIOU' for c in text)\n", _sentence,
    ),
    FunctionSpec(
        "is_palindrome", "strings", 1, "def is_palindrome(text: str) -> bool",
        "return True if `text` reads the same backwards, ignoring case and non-alphanumerics",
        "def is_palindrome(text):\n    kept = [c.lower() for c in text if c.isalnum()]\n"
        "    return kept == kept[::-1]\n", _palindrome,
    ),
    FunctionSpec(
        "caesar", "strings", 2, "def caesar(text: str) -> str",
        "shift every lowercase letter of `text` {k} places forward in the alphabet, wrapping "
        "from z to a; leave every other character as it is",
        "def caesar(text):\n    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) "
        "if 'a' <= c <= 'z' else c for c in text)\n", _sentence, tuple(range(1, 26)),
    ),
    FunctionSpec(
        "run_length", "strings", 3, "def run_length(text: str) -> str",
        "encode runs of equal characters as the character followed by the run length "
        "('aaab' -> 'a3b1')",
        "def run_length(text):\n    out = []\n    for c in text:\n"
        "        if out and out[-1][0] == c:\n            out[-1][1] += 1\n"
        "        else:\n            out.append([c, 1])\n"
        "    return ''.join(f'{c}{n}' for c, n in out)\n", _runs,
    ),
    FunctionSpec(
        "dedupe", "lists", 1, "def dedupe(values: list[int]) -> list[int]",
        "return `values` without repeated elements, keeping the first occurrence of each",
        "def dedupe(values):\n    seen = set()\n    out = []\n    for v in values:\n"
        "        if v not in seen:\n            seen.add(v)\n            out.append(v)\n"
        "    return out\n", _ints,
    ),
    FunctionSpec(
        "running_sum", "lists", 1, "def running_sum(values: list[int]) -> list[int]",
        "return the running totals of `values` ([1, 2, 3] -> [1, 3, 6])",
        "def running_sum(values):\n    out = []\n    total = 0\n    for v in values:\n"
        "        total += v\n        out.append(total)\n    return out\n", _ints,
    ),
    FunctionSpec(
        "second_largest", "lists", 2, "def second_largest(values: list[int]) -> int | None",
        "return the second largest distinct value of `values`, or None if there is none",
        "def second_largest(values):\n    distinct = sorted(set(values))\n"
        "    return distinct[-2] if len(distinct) > 1 else None\n", _ints,
    ),
    FunctionSpec(
        "rotate", "lists", 2, "def rotate(values: list[int]) -> list[int]",
        "rotate `values` left by {k} places ([1, 2, 3] rotated by 1 is [2, 3, 1]); an empty "
        "list stays empty",
        "def rotate(values):\n    if not values:\n        return []\n    k = {k} % len(values)\n"
        "    return values[k:] + values[:k]\n", _ints, (1, 2, 3, 4, 5, 6),
    ),
    FunctionSpec(
        "chunks", "lists", 2, "def chunks(values: list[int]) -> list[list[int]]",
        "split `values` into consecutive lists of {k} elements (the last may be shorter)",
        "def chunks(values):\n    return [values[i:i + {k}] for i in range(0, len(values), {k})]\n",
        _ints, (2, 3, 4, 5),
    ),
    FunctionSpec(
        "flatten_once", "lists", 3, "def flatten_once(values: list) -> list",
        "replace each list inside `values` by its elements (one level only); keep other items",
        "def flatten_once(values):\n    out = []\n    for v in values:\n"
        "        out.extend(v) if isinstance(v, list) else out.append(v)\n    return out\n",
        _nested,
    ),
    FunctionSpec(
        "digit_sum", "numbers", 1, "def digit_sum(n: int) -> int",
        "return the sum of the decimal digits of the non-negative integer `n`",
        "def digit_sum(n):\n    return sum(int(d) for d in str(n))\n", _natural,
    ),
    FunctionSpec(
        "is_prime", "numbers", 2, "def is_prime(n: int) -> bool",
        "return True if `n` is a prime number",
        "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n"
        "    while i * i <= n:\n        if n % i == 0:\n            return False\n        i += 1\n"
        "    return True\n", _natural,
    ),
    FunctionSpec(
        "gcd", "numbers", 2, "def gcd(a: int, b: int) -> int",
        "return the greatest common divisor of `a` and `b` without using the math module",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n", _pair,
    ),
    FunctionSpec(
        "fib", "numbers", 2, "def fib(n: int) -> int",
        "return the n-th Fibonacci number, with fib(0) == 0 and fib(1) == 1",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
        "    return a\n", _small,
    ),
    FunctionSpec(
        "to_base", "numbers", 3, "def to_base(n: int) -> str",
        "return the digits of the non-negative integer `n` written in base {k}",
        "def to_base(n):\n    digits = ''\n    while True:\n"
        "        digits = str(n % {k}) + digits\n        n //= {k}\n"
        "        if n == 0:\n            return digits\n", _natural,
        (2, 3, 4, 5, 6, 7, 8, 9),
    ),
    FunctionSpec(
        "collatz_steps", "numbers", 3, "def collatz_steps(n: int) -> int",
        "return how many Collatz steps (n/2 if even, else 3n+1) take `n` (>= 1) to 1",
        "def collatz_steps(n):\n    steps = 0\n    while n != 1:\n"
        "        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n    return steps\n",
        _small,
    ),
    FunctionSpec(
        "top_key", "dicts", 1, "def top_key(counts: dict[str, int]) -> str",
        "return the key with the largest value; on a tie, the alphabetically smallest key",
        "def top_key(counts):\n    return min(counts, key=lambda key: (-counts[key], key))\n",
        _mapping,
    ),
    FunctionSpec(
        "positive_keys", "dicts", 1, "def positive_keys(counts: dict[str, int]) -> list[str]",
        "return the sorted keys whose value is greater than zero",
        "def positive_keys(counts):\n    return sorted(k for k, v in counts.items() if v > 0)\n",
        _mapping,
    ),
    FunctionSpec(
        "invert", "dicts", 2, "def invert(mapping: dict[str, int]) -> dict[int, list[str]]",
        "map each value to the sorted list of keys that have it",
        "def invert(mapping):\n    out = dict()\n    for key in sorted(mapping):\n"
        "        out.setdefault(mapping[key], []).append(key)\n    return out\n", _mapping,
    ),
    FunctionSpec(
        "word_counts", "dicts", 2, "def word_counts(text: str) -> dict[str, int]",
        "count how often each whitespace-separated word occurs in `text`",
        "def word_counts(text):\n    out = dict()\n    for word in text.split():\n"
        "        out[word] = out.get(word, 0) + 1\n    return out\n", _sentence,
    ),
    FunctionSpec(
        "merge_sum", "dicts", 3, "def merge_sum(a: dict[str, int], b: dict[str, int]) -> dict",
        "merge the two dicts; a key in both maps to the sum of its two values",
        "def merge_sum(a, b):\n    out = dict(a)\n    for key, value in b.items():\n"
        "        out[key] = out.get(key, 0) + value\n    return out\n", _two_mappings,
    ),
)  # fmt: skip

CATEGORIES: Final = ("any", *sorted({spec.category for spec in SPECS}))
