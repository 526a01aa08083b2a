"""A reasoning-gym problem's identity: its split key, and the digest a rebuilt entry is
checked by.

The key never depends on the index, seed or domain that drew the problem, so a question
held out in one domain is held out in every domain that draws it.  Where a dataset writes
one problem several ways (the operands of a sum, product, gcd or lcm in any order), the key
is the problem as its entry's metadata states it, operands sorted: a held-out ``8 * 2`` is
never trained on as ``2 * 8``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, Final


def question_digest(question: str) -> str:
    return hashlib.blake2b(question.encode(), digest_size=12).hexdigest()


_NUMBER: Final = re.compile(r"\d+(?:\.\d+)?")


def _number_set(entry: Mapping[str, Any]) -> str | None:
    numbers = entry["metadata"]["numbers"]
    return "numbers " + " ".join(map(str, sorted(numbers)))


def _factors(entry: Mapping[str, Any]) -> str | None:
    factors = [f.strip() for f in str(entry["metadata"]["expression"]).split("*")]
    if not all(_NUMBER.fullmatch(f) for f in factors):
        return None
    return "product " + " ".join(sorted(factors, key=lambda f: (len(f), f)))


def _signed_terms(entry: Mapping[str, Any]) -> str | None:
    first, *rest = str(entry["metadata"]["expression"]).split()
    terms: dict[str, list[str]] = {"+": [first], "-": []}
    for sign, term in zip(rest[::2], rest[1::2], strict=True):
        terms[sign].append(term)  # KeyError on any other operator: keyed as written
    if not all(_NUMBER.fullmatch(t) for ts in terms.values() for t in ts):
        return None
    # One spelling of each value: 5.720 and 5.72 are one term.
    values = {s: sorted(str(Decimal(t).normalize()) for t in ts) for s, ts in terms.items()}
    return " ".join(f"{s} {' '.join(vs)}" for s, vs in values.items())


def _complex(entry: Mapping[str, Any]) -> str | None:
    metadata = entry["metadata"]
    operands = [tuple(metadata["num1"]), tuple(metadata["num2"])]
    if metadata["operation"] in ("+", "*"):
        operands.sort()
    return f"{metadata['operation']} {operands}"


#: Datasets whose questions spell one problem several ways (operands of a commutative
#: operation in any order): their key is the problem as its entry's metadata states it.
#: The others are keyed by the question as written.
CANONICAL: Final[Mapping[str, Callable[[Mapping[str, Any]], str | None]]] = {
    "gcd": _number_set,
    "lcm": _number_set,
    "products": _factors,
    "chain_sum": _signed_terms,
    "decimal_chain_sum": _signed_terms,
    "complex_arithmetic": _complex,
}


def problem_key(dataset: str, entry: Mapping[str, Any]) -> str:
    """The problem's identity: the same whatever index, seed or domain drew it, and for the
    datasets of :data:`CANONICAL` whatever order its operands were written in."""
    canonical: str | None = None
    if dataset in CANONICAL:
        try:
            canonical = CANONICAL[dataset](entry)
        except (KeyError, TypeError, ValueError):
            canonical = None  # a shape this version does not know: keyed as written
    text = f"canonical: {canonical}" if canonical is not None else str(entry["question"])
    return f"rg:{dataset}:{question_digest(text)}"
