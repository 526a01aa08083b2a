"""A quarterly financial report as data, drawn deterministically from a seed.

Amounts are integers in tenths of a thousand dollars (printed ``12,345.6``), so every
total and every reference answer is exact.  The statement of operations adds up, and
the segment breakdown sums to its revenue; the product-line table of a long report is
sized from the space left on its first page so that it always runs onto the next one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final, Literal

from services.domains.doc_qa import money

Length = Literal["short", "long"]
LENGTHS: Final[tuple[Length, ...]] = ("short", "long")

_NAMES: Final = ("North", "Blue", "Iron", "Silver", "Green", "Bright", "Stone", "Lake", "Cedar")
_ENDINGS: Final = ("wind", "field", "gate", "works", "point", "bridge", "line", "crest", "vale")
_SUFFIXES: Final = ("Inc.", "Corp.", "Holdings plc", "Group Ltd.")
SEGMENTS: Final = (
    "Cloud services",
    "Devices",
    "Enterprise software",
    "Payments",
    "Advertising",
    "Logistics",
    "Consulting",
)
REGIONS: Final = ("North America", "Europe", "Asia Pacific", "Latin America", "Middle East")
_PRODUCT_STEMS: Final = (
    "Atlas",
    "Beacon",
    "Comet",
    "Delta",
    "Ember",
    "Falcon",
    "Granite",
    "Harbor",
    "Ion",
    "Juniper",
)
_PRODUCT_KINDS: Final = ("Pro", "Lite", "Max", "Edge", "Core", "Plus", "Mini")
STATEMENT: Final = (
    "Revenue",
    "Cost of revenue",
    "Gross profit",
    "Research and development",
    "Selling, general and administrative",
    "Operating income",
    "Income tax",
    "Net income",
)
BALANCE: Final = (
    "Cash and equivalents",
    "Accounts receivable",
    "Inventories",
    "Total assets",
    "Total liabilities",
)


@dataclass(frozen=True)
class Row:
    label: str
    values: tuple[int, ...]

    def cells(self) -> tuple[str, ...]:
        return (self.label, *(money(v) for v in self.values))


@dataclass(frozen=True)
class Table:
    #: Numbered from 1 in reading order, as the captions print it.
    number: int
    title: str
    columns: tuple[str, ...]
    rows: tuple[Row, ...]

    def caption(self, continued: bool = False) -> str:
        more = " (continued)" if continued else ""
        return f"Table {self.number}: {self.title} (USD thousands){more}"

    def header(self) -> tuple[str, ...]:
        return ("Line item", *self.columns)

    def row(self, label: str) -> Row:
        return next(r for r in self.rows if r.label == label)

    def value(self, label: str, column: str) -> int:
        return self.row(label).values[self.columns.index(column)]


@dataclass(frozen=True)
class Paragraph:
    text: str
    heading: bool = False


Block = Paragraph | Table


@dataclass(frozen=True)
class Report:
    company: str
    quarters: tuple[str, ...]
    blocks: tuple[Block, ...]

    def tables(self) -> tuple[Table, ...]:
        return tuple(b for b in self.blocks if isinstance(b, Table))

    def table(self, number: int) -> Table:
        return self.tables()[number - 1]


def quarter_labels(rng: random.Random, count: int) -> tuple[str, ...]:
    start = rng.randint(2018, 2024) * 4 + rng.randrange(4)
    return tuple(f"Q{q % 4 + 1} {q // 4}" for q in range(start, start + count))


def _split(rng: random.Random, total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` positive amounts that add up exactly."""
    weights = [rng.randint(5, 40) for _ in range(parts)]
    shares = [total * w // sum(weights) for w in weights]
    shares[0] += total - sum(shares)
    return shares


def operations(rng: random.Random, quarters: int) -> list[Row]:
    revenue = [rng.randint(50_000, 2_000_000)]
    for _ in range(quarters - 1):  # a trend, as real revenue has: -8% to +12% a quarter
        revenue.append(revenue[-1] * rng.randint(92, 112) // 100)
    cost = [r * rng.randint(35, 60) // 100 for r in revenue]
    research = [r * rng.randint(5, 15) // 100 for r in revenue]
    selling = [r * rng.randint(5, 15) // 100 for r in revenue]
    gross = [r - c for r, c in zip(revenue, cost, strict=True)]
    operating = [g - a - b for g, a, b in zip(gross, research, selling, strict=True)]
    tax = [o * rng.randint(15, 25) // 100 for o in operating]
    net = [o - t for o, t in zip(operating, tax, strict=True)]
    values = (revenue, cost, gross, research, selling, operating, tax, net)
    return [Row(label, tuple(v)) for label, v in zip(STATEMENT, values, strict=True)]


def breakdown(rng: random.Random, names: list[str], totals: tuple[int, ...]) -> list[Row]:
    """Rows for ``names`` that sum, quarter by quarter, to ``totals``; then a Total row."""
    columns = [_split(rng, total, len(names)) for total in totals]
    rows = [Row(name, tuple(c[i] for c in columns)) for i, name in enumerate(names)]
    return [*rows, Row("Total", totals)]


def independent(rng: random.Random, names: list[str], quarters: int) -> list[Row]:
    return [Row(n, tuple(rng.randint(1_000, 400_000) for _ in range(quarters))) for n in names]


def product_names(rng: random.Random, count: int) -> list[str]:
    pool = [f"{s} {k}" for s in _PRODUCT_STEMS for k in _PRODUCT_KINDS]
    return rng.sample(pool, count)


def company(rng: random.Random) -> str:
    return f"{rng.choice(_NAMES)}{rng.choice(_ENDINGS)} {rng.choice(_SUFFIXES)}"
