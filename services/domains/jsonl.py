"""Domains over a JSONL dataset: one problem a line.

Each line is an object with ``question`` and ``answer`` (strings), and optionally
``id`` (decides the split by hash; default: the question), ``split`` (``train`` or
``eval``, overriding the hash), ``metadata`` (an object merged into the task's
metadata) and ``reference`` (a completion that earns the full reward).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from services.domains.api import SPLITS, Domain, DomainError, Problem, PromptFormat, ValidatorSpec
from services.domains.formats import INSTRUCTIONS, STYLES, answer_style, answer_text
from services.domains.params import Params

JUDGES: Final = ("exact", "math")


@dataclass(frozen=True)
class JsonlSource:
    path: Path
    problems: tuple[Problem, ...]

    def draw(self, rng: random.Random) -> Problem:
        return rng.choice(self.problems)


def _problem(domain: str, where: str, line: str, style: str) -> Problem:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DomainError(domain, f"{where}: not JSON ({error})") from None
    if not isinstance(record, dict):
        raise DomainError(domain, f"{where}: expected an object")
    question, answer = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not isinstance(answer, str):
        raise DomainError(domain, f"{where}: `question` and `answer` must be strings")
    split = record.get("split")
    if split is not None and split not in SPLITS:
        raise DomainError(domain, f"{where}: `split` must be one of {SPLITS}")
    extra = record.get("metadata", {})
    if not isinstance(extra, dict):
        raise DomainError(domain, f"{where}: `metadata` must be an object")
    return Problem(
        key=f"jsonl:{record.get('id', question)}",
        question=question,
        metadata={**extra, "answer": answer},
        reference=str(record.get("reference") or answer_text(answer, answer_style(style))),
        split=split,
    )


def load(domain: str, path: Path, style: str) -> JsonlSource:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise DomainError(domain, f"cannot read dataset {path}: {error.strerror}") from None
    problems = tuple(
        _problem(domain, f"{path}:{number}", line, style)
        for number, line in enumerate(lines, start=1)
        if line.strip()
    )
    if not problems:
        raise DomainError(domain, f"dataset {path} holds no problems")
    return JsonlSource(path, problems)


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, params)
    path = Path(read.text("path", ""))
    style = read.choice("style", "tag", STYLES)
    judge = read.choice("validator", "exact", JUDGES)
    read.done()
    if not path.name:
        raise DomainError(name, "parameter 'path' (the JSONL file) is required")
    return Domain(
        name=name,
        kind="jsonl",
        source=load(name, path, style),
        prompt=PromptFormat(system=INSTRUCTIONS[answer_style(style)]),
        validators=(ValidatorSpec(kind=judge, params={"extract": style}),),
        description=f"dataset {path.name}",
    )
