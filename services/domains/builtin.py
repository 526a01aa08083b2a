"""The built-in domain kinds (task source families) and the built-in domains made from them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from services.domains import (
    arithmetic,
    cad,
    compiled_functions,
    doc_qa,
    harbor_domain,
    jsonl,
    python_functions,
    reasoning_gym,
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
    "harbor": harbor_domain.domain,
    "jsonl": jsonl.domain,
    "reasoning_gym": reasoning_gym.domain,
}

#: What ``load_registry(None)`` serves: one domain per kind, with the kind's defaults.
BUILTIN: Final[tuple[tuple[str, str, Mapping[str, Any]], ...]] = (
    # Single-digit addition answered as <answer>N</answer>.
    ("arithmetic", "arithmetic", {}),
    # Sums of three single-digit numbers: 220 problems once spellings are folded together
    # (3+9+4 is 4+9+3), 35 of them held out.
    ("arithmetic_sum3", "arithmetic", {"terms": 3}),
    # Sums of four: 715 problems, 134 held out (one is worth 0.75 points). The learning
    # demo's domain: enough problems that what is learned must carry over to unseen ones.
    ("arithmetic_sum4", "arithmetic", {"terms": 4}),
    ("math_word_problems", "word_problems", {}),
    ("python_functions", "python_functions", {}),
    ("doc_numeric_qa", "doc_qa", {}),
    ("tool_use", "tool_use", {}),
)


def builtin_domains() -> list[Domain]:
    return [KINDS[kind](name, params) for name, kind, params in BUILTIN]
