"""The built-in domain kinds (task source families) and the built-in domains made from them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from services.domains import (
    arithmetic,
    cad,
    compiled_functions,
    doc_qa,
    jsonl,
    python_functions,
    tool_use,
    word_problems,
)
from services.domains.api import Domain
from services.domains.documents import family as documents_family
from services.domains.terminal import family as terminal_family

#: ``(name, params) -> Domain``: how a config file's ``kind`` becomes a domain.
Kind = Callable[[str, Mapping[str, Any]], Domain]

KINDS: Final[Mapping[str, Kind]] = {
    "arithmetic": arithmetic.domain,
    "word_problems": word_problems.domain,
    "python_functions": python_functions.domain,
    "compiled_functions": compiled_functions.domain,
    "cad_parts": cad.domain,
    "doc_qa": doc_qa.domain,
    "documents": documents_family.domain,
    "tool_use": tool_use.domain,
    "terminal": terminal_family.domain,
    "jsonl": jsonl.domain,
}

#: What ``load_registry(None)`` serves: one domain per kind, with the kind's defaults.
BUILTIN: Final[tuple[tuple[str, str, Mapping[str, Any]], ...]] = (
    # Single-digit addition answered as <answer>N</answer>.
    ("arithmetic", "arithmetic", {}),
    # Sums of three single-digit numbers (1,000 problems, about 200 held out): the
    # learning demo's domain, large enough that one held-out problem is worth 0.5 points.
    ("arithmetic_sum3", "arithmetic", {"terms": 3}),
    ("math_word_problems", "word_problems", {}),
    ("python_functions", "python_functions", {}),
    ("doc_numeric_qa", "doc_qa", {}),
    ("tool_use", "tool_use", {}),
)


def builtin_domains() -> list[Domain]:
    return [KINDS[kind](name, params) for name, kind, params in BUILTIN]
