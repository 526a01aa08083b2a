"""A whole report from a seed: narrative, tables, and numbering in reading order."""

from __future__ import annotations

import random
from typing import Final

from services.domains.documents.layout import LINES, MIN_ROWS, TABLE_FRAME, paginate
from services.domains.documents.model import (
    BALANCE,
    REGIONS,
    SEGMENTS,
    Block,
    Length,
    Paragraph,
    Report,
    Row,
    Table,
    breakdown,
    company,
    independent,
    operations,
    product_names,
)

_FILLER: Final = (
    "Management believes the figures below reflect the underlying trends of the business.",
    "Amounts are unaudited and presented in thousands of US dollars unless stated otherwise.",
    "Comparisons between quarters are affected by seasonality and by currency movements.",
    "The company reviews its segment reporting each year and restates prior periods if needed.",
    "Forward-looking statements involve risks and uncertainties described in the annual report.",
    "Figures may not add up exactly to the totals shown in other sections because of rounding.",
)
#: Rows of the product-line table that go over onto the next page, at least.
_CARRIED: Final = (4, 14)


def _prose(rng: random.Random, topic: str, sentences: int) -> Paragraph:
    chosen = rng.sample(_FILLER, sentences)
    return Paragraph(f"{topic} " + " ".join(chosen))


class _Builder:
    def __init__(self, rng: random.Random, quarters: tuple[str, ...]) -> None:
        self.rng = rng
        self.quarters = quarters
        self.blocks: list[Block] = []

    def section(self, heading: str, topic: str) -> None:
        self.blocks.append(Paragraph(heading, heading=True))
        self.blocks.append(_prose(self.rng, topic, self.rng.randint(1, 4)))

    def table(self, title: str, rows: list[Row]) -> None:
        number = sum(isinstance(b, Table) for b in self.blocks) + 1
        self.blocks.append(Table(number, title, self.quarters, tuple(rows)))

    def product_rows(self) -> int:
        """Enough rows to overflow the space left where the table starts."""
        free = paginate(self.blocks)[1]
        if free < TABLE_FRAME + MIN_ROWS:
            free = LINES
        return free - TABLE_FRAME + self.rng.randint(*_CARRIED)


def build_report(rng: random.Random, length: Length, quarters: tuple[str, ...]) -> Report:
    name = company(rng)
    build = _Builder(rng, quarters)
    build.blocks.append(Paragraph(f"{name} - quarterly report", heading=True))
    build.section("Results of operations", f"{name} reports its results for {quarters[-1]}.")
    statement = operations(rng, len(quarters))
    build.table("Condensed consolidated statement of operations", statement)
    revenue = statement[0].values
    segments = rng.sample(SEGMENTS, rng.randint(3, 5))
    build.section("Segment information", "Revenue by reportable segment is shown below.")
    build.table("Revenue by segment", breakdown(rng, segments, revenue))
    if length == "long":
        regions = rng.sample(REGIONS, rng.randint(3, 5))
        build.section("Geographic information", "Revenue by customer location follows.")
        build.table("Revenue by region", breakdown(rng, regions, revenue))
        build.section("Product lines", "Revenue of each product line is listed below.")
        products = product_names(rng, build.product_rows())
        build.table("Revenue by product line", independent(rng, products, len(quarters)))
    build.section("Financial position", "Selected balance sheet data at each quarter end.")
    build.table("Selected balance sheet data", independent(rng, list(BALANCE), len(quarters)))
    if length == "long":
        build.section("Outlook", "The outlook for the coming quarters is unchanged.")
    return Report(name, quarters, tuple(build.blocks))
