"""The checks of a documents answer, each with its own score and reason, and the reward.

``answer``: the ``<answer>`` is one number, the reference within tolerance; the
reference is computed from the operand cells as parsed from the file.
``grounded``: every value the citations state is the cited cell's, within tolerance.
``cells_exist``: every citation names a page, table, row and column the file has.
``cells_support``: the cited cells are exactly the cells the answer is computed from.

The reward pays for citations only beside an answer, and only for good ones: citation
quality is the share, among every cell cited or needed (and every citation that names
no cell), of the needed cells cited with their right value.  A missing cell, an extra
one, a wrong value and a citation of nothing all lower it, so padding with the whole
table pays nothing.  A right answer scores ``RIGHT + CITED x quality`` (0.6 to 1); a
wrong number ``WRONG_CITED x quality`` (the cells were found, the computation failed:
at most 0.1); no answer, or not one number, 0 whatever it cites.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from services.domains.documents.questions import Cell, Question, answer_text, compute
from services.domains.formats import ANSWER_TAG, CITE_TAG
from services.validator import extract
from services.validator.documents.cite import Citation, parse_citation
from services.validator.documents.parse import DocumentUnreadable, ParsedDocument, key
from services.validator.numbers import Number, find_numbers, numbers_match, parse_number

#: A cell as the checks compare them: (page, table, row key, column key).
CellKey = tuple[int, int, str, str]
#: A right answer's score without citations, and what perfect citations add to it.
RIGHT: Final = 0.6
CITED: Final = 0.4
#: What perfect citations earn beside a wrong number: less than any right answer.
WRONG_CITED: Final = 0.1


@dataclass(frozen=True)
class Check:
    name: str
    score: float
    reason: str


@dataclass(frozen=True)
class Assessment:
    """The checks for the details, and what the reward is made of."""

    checks: list[Check]
    #: The answer is one number (right or wrong).
    answered: bool
    right: bool
    #: Citation quality in [0, 1] (see the module's doc).
    quality: float

    def score(self) -> float:
        if not self.answered:
            return 0.0
        if self.right:
            return RIGHT + CITED * self.quality
        return WRONG_CITED * self.quality


@dataclass(frozen=True)
class Tolerance:
    rel_tol: float
    abs_tol: float

    def match(self, got: Number, want: Number) -> bool:
        return numbers_match(got, want, self.rel_tol, self.abs_tol)


@dataclass(frozen=True)
class Operands:
    """The question's cells as found in the file, and the answer they give."""

    cells: dict[CellKey, str]
    answer: Number
    text: str


def _locate(document: ParsedDocument, cell: Cell) -> tuple[CellKey, str, Fraction]:
    """Where the file prints an operand, how to name it, and its value."""
    pages = document.pages_of(cell.table, cell.row)
    if len(pages) != 1:
        raise DocumentUnreadable(f"{cell} is on pages {pages} of the file, not on one")
    text = document.tables[(pages[0], cell.table)].cell(cell.row, cell.column)
    number = parse_number(text) if text else None
    if number is None:
        raise DocumentUnreadable(f"{cell} reads {text!r} in the file, not a number")
    where = f'page {pages[0]}, table {cell.table}, row "{cell.row}", column "{cell.column}"'
    return (pages[0], cell.table, key(cell.row), key(cell.column)), where, number.value


def operands(document: ParsedDocument, question: Question) -> Operands:
    """Raises DocumentUnreadable when the file lacks a cell the question is built on."""
    located = [_locate(document, cell) for cell in question.cells]
    value = compute(question.op, [number for _, _, number in located])
    percent = question.op in ("growth", "share")
    cells = {cell_key: where for cell_key, where, _ in located}
    return Operands(cells, Number(value, percent), answer_text(question.op, value))


def answer_check(text: str, reference: Operands, tolerance: Tolerance) -> Check:
    given = extract.last_tag(text, ANSWER_TAG)
    if given is None:
        return Check("answer", 0.0, f"no <{ANSWER_TAG}>")
    numbers = find_numbers(given)
    if len(numbers) != 1:
        return Check("answer", 0.0, f"answer holds {len(numbers)} numbers, 1 expected")
    if tolerance.match(numbers[0], reference.answer):
        return Check("answer", 1.0, "matches the reference")
    return Check("answer", 0.0, f"wrong number: {given[:40]!r} is not {reference.text}")


def _resolve(document: ParsedDocument, cite: Citation) -> tuple[str | None, str]:
    """The cell's text, or None and why the citation names no cell."""
    part = document.tables.get((cite.page, cite.table))
    if part is None:
        return None, f"page {cite.page} has no table {cite.table}"
    if key(cite.row) not in part.rows:
        elsewhere = document.pages_of(cite.table, cite.row)
        hint = f" (it is on page {elsewhere[0]})" if elsewhere else ""
        return None, f'table {cite.table} on page {cite.page} has no row "{cite.row}"{hint}'
    cell = part.cell(cite.row, cite.column)
    if cell is None:
        return None, f'table {cite.table} has no column "{cite.column}"'
    return cell, ""


@dataclass(frozen=True)
class Resolved:
    citation: Citation
    cell: str

    @property
    def key(self) -> CellKey:
        c = self.citation
        return (c.page, c.table, key(c.row), key(c.column))


@dataclass(frozen=True)
class Cited:
    """What a completion's citations came to."""

    checks: list[Check]
    quality: float


def citation_checks(
    text: str, document: ParsedDocument, reference: Operands, tolerance: Tolerance
) -> Cited:
    spans = extract.tags(text, CITE_TAG)
    if not spans:
        names = ("grounded", "cells_exist", "cells_support")
        return Cited([Check(name, 0.0, "no citation") for name in names], 0.0)
    resolved: list[Resolved] = []
    missing: list[str] = []
    for index, span in enumerate(spans, start=1):
        cite = parse_citation(span)
        if cite is None:
            missing.append(
                f'citation {index} is not \'page P, table T, row "R", column "C": value\''
            )
            continue
        cell, why = _resolve(document, cite)
        if cell is None:
            missing.append(f"citation {index} cites a cell that does not exist: {why}")
        else:
            resolved.append(Resolved(cite, cell))
    exist = Check(
        "cells_exist", len(resolved) / len(spans), "; ".join(missing) or "all cells exist"
    )
    checks = [_grounded(resolved, tolerance), exist, _support(resolved, reference)]
    return Cited(checks, _quality(resolved, len(missing), reference, tolerance))


def _quality(
    resolved: Sequence[Resolved], unresolved: int, reference: Operands, tolerance: Tolerance
) -> float:
    """Needed cells cited with their right value, over every cell cited or needed and every
    citation that names no cell."""
    cited, needed = {item.key for item in resolved}, set(reference.cells)
    good = {item.key for item in resolved if item.key in needed and _right(item, tolerance)}
    return len(good) / (len(cited | needed) + unresolved)


def _right(item: Resolved, tolerance: Tolerance) -> bool:
    value = parse_number(item.cell)
    stated = item.citation.value
    return stated is not None and value is not None and tolerance.match(stated, value)


def _grounded(resolved: Sequence[Resolved], tolerance: Tolerance) -> Check:
    if not resolved:
        return Check("grounded", 0.0, "no citation names a cell")
    wrong: list[str] = []
    for item in resolved:
        cite, value = item.citation, parse_number(item.cell)
        if cite.value is None:
            wrong.append(f"{cite.where()} states no value")
        elif value is None or not tolerance.match(cite.value, value):
            wrong.append(f"{cite.where()} states {cite.stated}, the document has {item.cell}")
    share = 1 - len(wrong) / len(resolved)
    return Check("grounded", share, "; ".join(wrong) or "every cited value is the document's")


def _support(resolved: Sequence[Resolved], reference: Operands) -> Check:
    cited = {item.key: item.citation.where() for item in resolved}
    needed = reference.cells
    reasons = [f"{where} is used but not cited" for k, where in needed.items() if k not in cited]
    reasons += [
        f"{where} does not support the number (not used by its computation)"
        for k, where in cited.items()
        if k not in needed
    ]
    overlap = len(set(cited) & set(needed)) / len(set(cited) | set(needed))
    return Check("cells_support", overlap, "; ".join(reasons) or "cites exactly the cells used")


def assess(
    text: str, document: ParsedDocument, question: Question, tolerance: Tolerance
) -> Assessment:
    reference = operands(document, question)
    answer = answer_check(text, reference, tolerance)
    cited = citation_checks(text, document, reference, tolerance)
    answered = answer.score == 1.0 or answer.reason.startswith("wrong number")
    return Assessment([answer, *cited.checks], answered, answer.score == 1.0, cited.quality)


def total(assessment: Assessment) -> tuple[float, str]:
    """The score, and every check's score and reason for the details."""
    checks = assessment.checks
    reasons = "; ".join(f"{c.name} {c.score:.2f}: {c.reason}" for c in checks)
    return assessment.score(), f"{reasons}; citation quality {assessment.quality:.2f}"
