"""Pages of a report: a fixed grid of lines, so the PDF, the HTML and the prompt agree.

Every page holds :data:`LINES` lines.  A paragraph takes its wrapped lines plus a blank
one; a table takes a caption, a header and its rows.  A table that does not fit starts
on the page anyway when its caption, header and :data:`MIN_ROWS` rows do, and goes on
over the next page under a "(continued)" caption and a repeated header, as filings do.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Final

from services.domains.documents.model import Block, Paragraph, Report, Table

LINES: Final = 46
WRAP: Final = 100
MIN_ROWS: Final = 3
#: Caption and header lines above a table's rows, and the blank line after them.
TABLE_FRAME: Final = 3


@dataclass(frozen=True)
class Text:
    text: str
    heading: bool = False


@dataclass(frozen=True)
class Slice:
    """Rows ``start:stop`` of a table on one page."""

    table: Table
    start: int
    stop: int

    @property
    def continued(self) -> bool:
        return self.start > 0


Item = Text | Slice


@dataclass(frozen=True)
class Page:
    number: int
    items: tuple[Item, ...]


def lines_of(paragraph: Paragraph) -> list[str]:
    return textwrap.wrap(paragraph.text, WRAP) or [""]


class _Pager:
    def __init__(self) -> None:
        self.pages: list[list[Item]] = [[]]
        self.used = 0

    def free(self) -> int:
        return LINES - self.used

    def new_page(self) -> None:
        self.pages.append([])
        self.used = 0

    def paragraph(self, paragraph: Paragraph) -> None:
        lines = lines_of(paragraph)
        if len(lines) + 1 > self.free():
            self.new_page()
        self.pages[-1].extend(Text(line, paragraph.heading) for line in lines)
        self.used += len(lines) + 1

    def table(self, table: Table) -> None:
        start = 0
        while start < len(table.rows):
            rows_left = len(table.rows) - start
            if self.free() < TABLE_FRAME + min(MIN_ROWS, rows_left):
                self.new_page()
            stop = start + min(rows_left, self.free() - TABLE_FRAME)
            self.pages[-1].append(Slice(table, start, stop))
            self.used += TABLE_FRAME + stop - start
            start = stop

    def add(self, block: Block) -> None:
        if isinstance(block, Table):
            self.table(block)
        else:
            self.paragraph(block)


def paginate(blocks: tuple[Block, ...] | list[Block]) -> tuple[list[Page], int]:
    """The pages, and the lines still free on the last one."""
    pager = _Pager()
    for block in blocks:
        pager.add(block)
    pages = [Page(i + 1, tuple(items)) for i, items in enumerate(pager.pages)]
    return pages, pager.free()


def pages(report: Report) -> list[Page]:
    return paginate(report.blocks)[0]


def page_text(page: Page) -> str:
    """A page as text extraction gives it: lines, and table rows with cells between bars."""
    out = [f"--- page {page.number} ---"]
    for item in page.items:
        if isinstance(item, Text):
            out.append(item.text)
            continue
        table = item.table
        out.append(table.caption(item.continued))
        out.append(" | ".join(table.header()))
        out.extend(" | ".join(row.cells()) for row in table.rows[item.start : item.stop])
    return "\n".join(out)


def report_text(report: Report) -> str:
    return "\n\n".join(page_text(page) for page in pages(report))


def table_pages(report: Report) -> dict[tuple[int, str], int]:
    """(table number, row label) -> the page the row is printed on."""
    found: dict[tuple[int, str], int] = {}
    for page in pages(report):
        for item in page.items:
            if isinstance(item, Slice):
                for row in item.table.rows[item.start : item.stop]:
                    found[(item.table.number, row.label)] = page.number
    return found
