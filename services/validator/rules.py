"""Rule validators: answer match, math, format, tool-call format, length, document numeric QA."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from protocol.messages import FinishReason, Rollout
from services.domains.formats import ANSWER_TAG, CITE_TAG
from services.validator import extract
from services.validator.base import InvalidRollout, RuleValidator, Verdict, reference, references
from services.validator.numbers import Number, find_numbers, numbers_match, parse_number

_SPACES = re.compile(r"\s+")
_EDGE_PUNCTUATION = "\"'`.,;:!? "


def normalize(text: str, case_sensitive: bool = False) -> str:
    """Unicode-normalised, whitespace collapsed, edge punctuation dropped, case folded."""
    text = _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip(_EDGE_PUNCTUATION)
    return text if case_sensitive else text.casefold()


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


@dataclass(frozen=True)
class ExactMatch(RuleValidator):
    """1 if the extracted answer equals a reference answer after normalisation, else 0."""

    extract: extract.Extract = "auto"
    case_sensitive: bool = False
    normalized: bool = True
    answer_key: str = "answer"

    def _norm(self, text: str) -> str:
        return normalize(text, self.case_sensitive) if self.normalized else text.strip()

    def check(self, rollout: Rollout) -> Verdict:
        wanted = {self._norm(r) for r in references(rollout.task, self.answer_key)}
        got = extract.answer(rollout.completion_text, self.extract)
        if got is None:
            return Verdict(0.0, f"no answer found (extract={self.extract})")
        if self._norm(got) in wanted:
            return Verdict(1.0, "match")
        return Verdict(0.0, f"answer {_shown(got)} does not match")


@dataclass(frozen=True)
class MathAnswer(RuleValidator):
    """1 if the extracted answer is the reference number within tolerance, else 0."""

    extract: extract.Extract = "auto"
    rel_tol: float = 1e-6
    abs_tol: float = 1e-9
    answer_key: str = "answer"

    def check(self, rollout: Rollout) -> Verdict:
        wanted = [
            _reference_number(rollout, text) for text in references(rollout.task, self.answer_key)
        ]
        got_text = extract.answer(rollout.completion_text, self.extract)
        if got_text is None:
            return Verdict(0.0, f"no answer found (extract={self.extract})")
        got = parse_number(got_text)
        if got is None:
            return Verdict(0.0, f"answer {_shown(got_text)} is not a number")
        if any(numbers_match(got, w, self.rel_tol, self.abs_tol) for w in wanted):
            return Verdict(1.0, "match")
        return Verdict(0.0, f"answer {_shown(got_text)} is not the reference")


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _reference_number(rollout: Rollout, text: str) -> Number:
    number = parse_number(text)
    if number is None:
        raise InvalidRollout(f"task {rollout.task.id}: reference {text!r} is not a number")
    return number


@dataclass(frozen=True)
class FormatCheck(RuleValidator):
    """1 if the completion has the required shape (a regex, tags, a boxed answer), else 0."""

    pattern: re.Pattern[str] | None = None
    fullmatch: bool = False
    required_tags: tuple[str, ...] = ()
    boxed: bool = False

    def check(self, rollout: Rollout) -> Verdict:
        text = rollout.completion_text
        if self.pattern is not None:
            matched = self.pattern.fullmatch(text) if self.fullmatch else self.pattern.search(text)
            if matched is None:
                return Verdict(0.0, f"does not match /{self.pattern.pattern}/")
        for tag in self.required_tags:
            if extract.last_tag(text, tag) is None:
                return Verdict(0.0, f"no complete <{tag}>...</{tag}>")
            if extract.unclosed(text, tag):
                return Verdict(0.0, f"unclosed <{tag}>")
        if self.boxed and extract.last_boxed(text) is None:
            return Verdict(0.0, "no \\boxed{...}")
        return Verdict(1.0, "well formed")


@dataclass(frozen=True)
class ToolCallFormat(RuleValidator):
    """Share of well-formed tool calls (JSON with ``name`` and object ``arguments``, known tool).

    The calls are read from the ``<tool_call>`` blocks of the completion, else from the
    rollout's recorded tool calls.  Fewer than ``min_calls`` well-formed calls score 0.
    """

    min_calls: int = 1
    known_tools_only: bool = True

    def check(self, rollout: Rollout) -> Verdict:
        calls = extract.tool_calls(rollout.completion_text) or [
            extract.parse_call(_call_json(c.name, c.arguments)) for c in rollout.tool_calls
        ]
        allowed = set(rollout.task.tools) if self.known_tools_only else set()
        problems = [self._problem(call, allowed) for call in calls]
        good = problems.count("")
        if good < self.min_calls:
            why = next((p for p in problems if p), "no tool call")
            return Verdict(0.0, f"{good} well-formed calls, {self.min_calls} needed ({why})")
        if not calls:
            return Verdict(1.0, "no tool calls (none needed)")
        return Verdict(good / len(calls), f"{good}/{len(calls)} calls well formed")

    @staticmethod
    def _problem(call: extract.ParsedCall, allowed: set[str]) -> str:
        if call.error:
            return call.error
        if allowed and call.name not in allowed:
            return f"unknown tool {call.name!r}"
        return ""


def _call_json(name: str, arguments: str) -> str:
    return json.dumps({"name": name, "arguments": arguments})


@dataclass(frozen=True)
class LengthPenalty(RuleValidator):
    """0 up to ``limit``, falling linearly to -1 at ``hard``; ``-truncated`` if cut off.

    Use it with a positive weight: it only ever takes reward away.
    """

    limit: int
    hard: int
    unit: str = "chars"
    truncated: float = 1.0

    def check(self, rollout: Rollout) -> Verdict:
        size = self._size(rollout)
        over = max(0, size - self.limit) / max(1, self.hard - self.limit)
        score = -min(1.0, over)
        if rollout.finish_reason is FinishReason.LENGTH:
            score = min(score, -self.truncated)
        return Verdict(score, f"{size} {self.unit} (limit {self.limit}, hard {self.hard})")

    def _size(self, rollout: Rollout) -> int:
        if self.unit == "tokens":
            return len(rollout.tokens) // 4 - rollout.prompt_len
        return len(rollout.completion_text)


@dataclass(frozen=True)
class DocNumericQA(RuleValidator):
    """Answer values and citations checked against the task's source document.

    score = values x (0.6 + 0.4 x citations).  values: share of reference numbers
    matched (within tolerance) by the numbers of the ``<answer>``, which must hold exactly
    as many.  citations: share of ``<cite>`` spans found verbatim in the document
    (whitespace folded) that quote some evidence amount, times the share of the evidence
    amounts quoted.  So citations pay only beside a right answer, a citation of anything
    else (or of nothing) lowers them, and a right answer without citations keeps 0.6.
    """

    #: A right answer's score without citations, and what perfect citations add to it.
    RIGHT: ClassVar[float] = 0.6
    CITED: ClassVar[float] = 0.4

    rel_tol: float = 0.005
    abs_tol: float = 0.01
    max_citation_chars: int = 400

    def check(self, rollout: Rollout) -> Verdict:
        task, text = rollout.task, rollout.completion_text
        document = reference(task, "document")
        if not isinstance(document, str):
            raise InvalidRollout(f"task {task.id}: metadata['document'] is not text")
        wanted = [_reference_number(rollout, r) for r in references(task, "answer")]
        given = extract.last_tag(text, ANSWER_TAG)
        if given is None:
            return Verdict(0.0, f"no <{ANSWER_TAG}>")
        values, value_note = self._values(find_numbers(given), wanted)
        cites, cite_note = self._citations(extract.tags(text, CITE_TAG), document, task.metadata)
        return Verdict(values * (self.RIGHT + self.CITED * cites), f"{value_note}; {cite_note}")

    def _values(self, got: list[Number], wanted: list[Number]) -> tuple[float, str]:
        if len(got) != len(wanted):
            return 0.0, f"answer holds {len(got)} numbers, {len(wanted)} expected"
        free = list(got)
        matched = 0
        for want in wanted:
            hit = next(
                (g for g in free if numbers_match(g, want, self.rel_tol, self.abs_tol)), None
            )
            if hit is not None:
                free.remove(hit)
                matched += 1
        return matched / len(wanted), f"{matched}/{len(wanted)} values match"

    def _citations(
        self, cites: Sequence[str], document: str, metadata: dict[str, object]
    ) -> tuple[float, str]:
        if not cites:
            return 0.0, "no citation"
        source = _SPACES.sub(" ", document)
        verbatim = [
            c
            for c in (_SPACES.sub(" ", c) for c in cites)
            if 0 < len(c) <= self.max_citation_chars and c in source
        ]
        evidence = _strings(metadata.get("evidence"))
        quoted = [e for e in evidence if any(e in c for c in verbatim)]
        coverage = len(quoted) / len(evidence) if evidence else 1.0
        # A verbatim quote of something else is padding: it counts against the share.
        relevant = [c for c in verbatim if not evidence or any(e in c for e in evidence)]
        share = len(relevant) / len(cites)
        note = (
            f"{len(verbatim)}/{len(cites)} citations verbatim, {len(relevant)} quoting "
            f"evidence, evidence {coverage:.2f}"
        )
        return share * coverage, note
