"""Document numeric QA over synthetic quarterly financial tables.

The prompt holds a table; the answer is a number in ``<answer>`` plus the rows it
used quoted verbatim in ``<cite>``.  The ``doc_qa`` validator checks the number
against the reference within tolerance and each citation against the document.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from services.domains.api import Domain, Problem, PromptFormat, ValidatorSpec
from services.domains.formats import ANSWER_TAG, CITE_TAG
from services.domains.params import Params

ITEMS: Final = ("Revenue", "Cost of revenue", "Gross profit", "Operating expenses", "Net income")
_NAMES: Final = ("North", "Blue", "Iron", "Silver", "Green", "Bright", "Stone", "Lake")
_ENDINGS: Final = ("wind", "field", "gate", "works", "point", "bridge", "line", "crest")
SYSTEM: Final = (
    "Answer the question using only the document. Quote every table row you used, "
    f"verbatim, in <{CITE_TAG}>...</{CITE_TAG}>, then give the number in "
    f"<{ANSWER_TAG}>...</{ANSWER_TAG}>."
)


def money(tenths: int) -> str:
    """``1234567`` tenths -> ``123,456.7`` (how the tables print amounts)."""
    sign = "-" if tenths < 0 else ""
    whole, tenth = divmod(abs(tenths), 10)
    return f"{sign}{whole:,}.{tenth}"


def two_decimals(value: Fraction) -> str:
    return f"{float(value):.2f}"


@dataclass(frozen=True)
class Table:
    company: str
    quarters: tuple[str, ...]
    #: Line item -> one amount per quarter, in tenths of a thousand dollars.
    rows: Mapping[str, tuple[int, ...]]

    def row_text(self, item: str) -> str:
        return " | ".join((item, *(money(v) for v in self.rows[item])))

    def text(self) -> str:
        header = " | ".join(("Line item", *self.quarters))
        lines = [f"{self.company} - quarterly results (USD thousands)", "", header]
        return "\n".join(lines + [self.row_text(item) for item in ITEMS])


def make_table(rng: random.Random, quarters: int) -> Table:
    year = rng.randint(2015, 2024)
    labels = tuple(f"Q{q % 4 + 1} {year + q // 4}" for q in range(quarters))
    revenue = [rng.randint(10_000, 999_999) for _ in labels]
    cost = [r * rng.randint(30, 70) // 100 for r in revenue]
    opex = [r * rng.randint(10, 35) // 100 for r in revenue]
    gross = [r - c for r, c in zip(revenue, cost, strict=True)]
    net = [g - o for g, o in zip(gross, opex, strict=True)]
    company = f"{rng.choice(_NAMES)}{rng.choice(_ENDINGS)} {rng.choice(('Inc.', 'Corp.', 'Ltd.'))}"
    values = (revenue, cost, gross, opex, net)
    return Table(company, labels, {item: tuple(v) for item, v in zip(ITEMS, values, strict=True)})


@dataclass(frozen=True)
class Question:
    text: str
    answer: str
    #: Line items whose rows the answer needs.
    items: tuple[str, ...]
    #: The amounts (as printed) that the citations must contain.
    evidence: tuple[str, ...]


def _span(rng: random.Random, table: Table) -> tuple[int, int]:
    first = rng.randrange(len(table.quarters) - 1)
    return first, rng.randrange(first + 1, len(table.quarters))


def _lookup(rng: random.Random, table: Table) -> Question:
    item, q = rng.choice(ITEMS), rng.randrange(len(table.quarters))
    amount = money(table.rows[item][q])
    text = f"What was {item.lower()} in {table.quarters[q]}, in USD thousands?"
    return Question(text, amount, (item,), (amount,))


def _total(rng: random.Random, table: Table, average: bool) -> Question:
    item, (a, b) = rng.choice(ITEMS), _span(rng, table)
    cells = table.rows[item][a : b + 1]
    what = "average quarterly" if average else "total"
    text = (
        f"What was the {what} {item.lower()} from {table.quarters[a]} to {table.quarters[b]} "
        "inclusive, in USD thousands?"
    )
    value = Fraction(sum(cells), 10 * (len(cells) if average else 1))
    answer = two_decimals(value) if average else money(sum(cells))
    return Question(text, answer, (item,), tuple(money(c) for c in cells))


def _change(rng: random.Random, table: Table, percent: bool) -> Question:
    item, (a, b) = rng.choice(ITEMS[:2] + ITEMS[3:4]), _span(rng, table)
    start, end = table.rows[item][a], table.rows[item][b]
    qa, qb = table.quarters[a], table.quarters[b]
    if percent:
        text = f"By what percentage did {item.lower()} change from {qa} to {qb}?"
        answer = two_decimals(Fraction(100 * (end - start), start)) + "%"
    else:
        text = f"By how much did {item.lower()} change from {qa} to {qb}, in USD thousands?"
        answer = money(end - start)
    return Question(text, answer, (item,), (money(start), money(end)))


def _margin(rng: random.Random, table: Table) -> Question:
    q = rng.randrange(len(table.quarters))
    gross, revenue = table.rows["Gross profit"][q], table.rows["Revenue"][q]
    text = f"What was the gross margin (gross profit / revenue) in {table.quarters[q]}, in percent?"
    answer = two_decimals(Fraction(100 * gross, revenue)) + "%"
    return Question(text, answer, ("Revenue", "Gross profit"), (money(revenue), money(gross)))


QUESTIONS: Final[dict[str, Callable[[random.Random, Table], Question]]] = {
    "lookup": _lookup,
    "sum": lambda rng, table: _total(rng, table, average=False),
    "average": lambda rng, table: _total(rng, table, average=True),
    "difference": lambda rng, table: _change(rng, table, percent=False),
    "growth": lambda rng, table: _change(rng, table, percent=True),
    "margin": _margin,
}


def problem_digest(table: Table, question: Question) -> str:
    """What decides the answer: the amounts and the question asked of them.

    The company's name and the years printed are left out (quarters become their
    positions): a table renamed or shifted by a year is the same problem.
    """
    asked = question.text
    for position, label in enumerate(table.quarters):
        asked = asked.replace(label, f"<quarter {position}>")
    amounts = "\n".join(",".join(map(str, table.rows[item])) for item in ITEMS)
    return hashlib.blake2b(f"{amounts}\n{asked}".encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class DocQASource:
    kinds: Sequence[str]
    quarters: int

    def draw(self, rng: random.Random) -> Problem:
        table = make_table(rng, self.quarters)
        question = QUESTIONS[rng.choice(self.kinds)](rng, table)
        document = table.text()
        cites = "\n".join(
            f"<{CITE_TAG}>{table.row_text(item)}</{CITE_TAG}>" for item in question.items
        )
        return Problem(
            key=f"docqa:{problem_digest(table, question)}",
            question=f"Document:\n{document}\n\nQuestion: {question.text}",
            metadata={
                "answer": question.answer,
                "document": document,
                "evidence": list(question.evidence),
            },
            reference=f"{cites}\n<{ANSWER_TAG}>{question.answer}</{ANSWER_TAG}>",
        )


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, params)
    kind = read.choice("question", "any", ("any", *QUESTIONS))
    quarters = read.integer("quarters", 4, 2, 40)
    rel_tol = read.number("rel_tol", 0.005, 0.0, 1.0)
    read.done()
    return Domain(
        name=name,
        kind="doc_qa",
        source=DocQASource(kinds=tuple(QUESTIONS) if kind == "any" else (kind,), quarters=quarters),
        prompt=PromptFormat(system=SYSTEM),
        validators=(ValidatorSpec(kind="doc_qa", params={"rel_tol": rel_tol, "abs_tol": 0.01}),),
        max_tokens=384,
        description=f"{kind} questions over {quarters}-quarter financial tables",
    )
