"""The four checks of a documents answer, each with its own score and reason.

``answer``: the ``<answer>`` is one number, the reference within tolerance; the
reference is computed from the operand cells as parsed from the file.
``grounded``: every value the citations state is the cited cell's, within tolerance.
``cells_exist``: every citation names a page, table, row and column the file has.
``cells_support``: the cited cells are exactly the cells the answer is computed from
(Jaccard overlap: a missing one and an extra one both cost).
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
WEIGHTS: Final = {"answer": 0.4, "grounded": 0.2, "cells_exist": 0.2, "cells_support": 0.2}


@dataclass(frozen=True)
class Check:
    name: str
    score: float
    reason: str


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


def citation_checks(
    text: str, document: ParsedDocument, reference: Operands, tolerance: Tolerance
) -> list[Check]:
    spans = extract.tags(text, CITE_TAG)
    if not spans:
        return [
            Check(name, 0.0, "no citation") for name in ("grounded", "cells_exist", "cells_support")
        ]
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
    return [_grounded(resolved, tolerance), exist, _support(resolved, reference)]


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
) -> list[Check]:
    reference = operands(document, question)
    return [
        answer_check(text, reference, tolerance),
        *citation_checks(text, document, reference, tolerance),
    ]


def total(checks: Sequence[Check]) -> tuple[float, str]:
    """The weighted score, and every check's score and reason for the details."""
    score = sum(WEIGHTS[c.name] * c.score for c in checks)
    return score, "; ".join(f"{c.name} {c.score:.2f}: {c.reason}" for c in checks)
