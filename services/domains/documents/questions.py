"""Numeric questions over a report, each with the exact cells its answer is computed from.

A question names its operands as (table, row, column); the validator finds them in the
file it parses, computes the answer from those values with :func:`compute`, and asks
the citations to name exactly those cells.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, Literal

from services.domains.doc_qa import money, two_decimals
from services.domains.documents.layout import table_pages
from services.domains.documents.model import Report, Table

Op = Literal["sum", "difference", "growth", "share"]
KINDS: Final = ("lookup", "sum", "difference", "growth", "share", "combined")


@dataclass(frozen=True)
class Cell:
    table: int
    row: str
    column: str


@dataclass(frozen=True)
class Question:
    kind: str
    text: str
    op: Op
    cells: tuple[Cell, ...]


def compute(op: str, values: Sequence[Fraction]) -> Fraction:
    """The answer from the operands' values, in their order (percentages for growth, share)."""
    if op == "sum":
        return sum(values, Fraction(0))
    if op == "difference":
        return values[1] - values[0]
    if op == "growth":
        return 100 * (values[1] - values[0]) / values[0]
    if op == "share":
        return 100 * values[0] / values[1]
    raise ValueError(f"unknown operation {op!r}")


def answer_text(op: str, value: Fraction) -> str:
    """How the reference answer is written: an amount, or a percentage to two decimals."""
    if op in ("growth", "share"):
        return two_decimals(value) + "%"
    return money(round(value * 10))


def _span(rng: random.Random, columns: tuple[str, ...], cells: int) -> tuple[str, ...]:
    first = rng.randrange(len(columns) - cells + 1)
    return columns[first : first + cells]


def _lookup(rng: random.Random, report: Report) -> Question:
    table = rng.choice(report.tables())
    row, column = rng.choice(table.rows).label, rng.choice(table.columns)
    text = f"What does table {table.number} report for {row} in {column}, in USD thousands?"
    return Question("lookup", text, "sum", (Cell(table.number, row, column),))


def _sum(rng: random.Random, report: Report) -> Question:
    table = rng.choice(report.tables()[:3])
    row = rng.choice(table.rows).label
    columns = _span(rng, table.columns, rng.randint(2, len(table.columns)))
    text = (
        f"What is the total of {row} in table {table.number} from {columns[0]} to "
        f"{columns[-1]} inclusive, in USD thousands?"
    )
    return Question("sum", text, "sum", tuple(Cell(table.number, row, c) for c in columns))


def _change(rng: random.Random, report: Report, kind: Literal["difference", "growth"]) -> Question:
    table = rng.choice((report.tables()[0], report.tables()[-1]))
    row = rng.choice(table.rows).label
    first, last = sorted(rng.sample(range(len(table.columns)), 2))
    a, b = table.columns[first], table.columns[last]
    if kind == "growth":
        text = f"By what percentage did {row} (table {table.number}) change from {a} to {b}?"
    else:
        text = (
            f"By how much did {row} (table {table.number}) change from {a} to {b}, "
            "in USD thousands?"
        )
    return Question(kind, text, kind, (Cell(table.number, row, a), Cell(table.number, row, b)))


def _share(rng: random.Random, report: Report) -> Question:
    """Across tables: a segment's revenue as a share of the statement's revenue."""
    statement, segments = report.tables()[0], report.tables()[1]
    segment = rng.choice(segments.rows[:-1]).label
    column = rng.choice(statement.columns)
    text = (
        f"What share of the revenue in table {statement.number} did the {segment} segment "
        f"(table {segments.number}) contribute in {column}, in percent?"
    )
    cells = (Cell(segments.number, segment, column), Cell(statement.number, "Revenue", column))
    return Question("share", text, "share", cells)


def _breakdown(report: Report) -> Table:
    """The product-line table of a long report (it spans pages), else the segments."""
    products = [t for t in report.tables() if t.title == "Revenue by product line"]
    return products[0] if products else report.tables()[1]


def _combined(rng: random.Random, report: Report) -> Question:
    """Two rows of one table; across its page break when it has one."""
    table = _breakdown(report)
    pages = table_pages(report)
    rows = [r.label for r in table.rows if r.label != "Total"]
    first = rng.choice(rows)
    other_page = [r for r in rows if pages[(table.number, r)] != pages[(table.number, first)]]
    second = rng.choice(other_page or [r for r in rows if r != first])
    column = rng.choice(table.columns)
    text = (
        f"What was the combined revenue of {first} and {second} (table {table.number}) "
        f"in {column}, in USD thousands?"
    )
    cells = (Cell(table.number, first, column), Cell(table.number, second, column))
    return Question("combined", text, "sum", cells)


MAKERS: Final[dict[str, Callable[[random.Random, Report], Question]]] = {
    "lookup": _lookup,
    "sum": _sum,
    "difference": lambda rng, report: _change(rng, report, "difference"),
    "growth": lambda rng, report: _change(rng, report, "growth"),
    "share": _share,
    "combined": _combined,
}


def reference_value(report: Report, question: Question) -> Fraction:
    values = [Fraction(report.table(c.table).value(c.row, c.column), 10) for c in question.cells]
    return compute(question.op, values)
