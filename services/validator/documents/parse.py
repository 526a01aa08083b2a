"""Tables read back from a rendered report: pdfplumber for PDF, html.parser for HTML.

The result names each table by its page and the number its caption prints, so a
citation (page, table, row, column) is looked up in what the file holds, not in what
the generator meant to write.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Final

import pdfplumber

_CAPTION: Final = re.compile(r"Table\s+(\d+)\b")
_SPACES: Final = re.compile(r"\s+")
#: Points above a table's grid where its caption is printed.
_CAPTION_BAND: Final = 15.0


class DocumentUnreadable(Exception):
    """The rendered file could not be parsed into captioned tables."""


def key(name: str) -> str:
    """How row and column names are compared: whitespace folded, case folded."""
    return _SPACES.sub(" ", name).strip().strip("\"'").casefold()


@dataclass
class ParsedTable:
    columns: dict[str, int] = field(default_factory=dict)
    #: Row key -> the row's cells after its label.
    rows: dict[str, list[str]] = field(default_factory=dict)

    def cell(self, row: str, column: str) -> str | None:
        cells, index = self.rows.get(key(row)), self.columns.get(key(column))
        return None if cells is None or index is None or index >= len(cells) else cells[index]


@dataclass
class ParsedDocument:
    #: (page, table number) -> the part of the table printed on that page.
    tables: dict[tuple[int, int], ParsedTable] = field(default_factory=dict)

    def pages_of(self, table: int, row: str) -> list[int]:
        return sorted(
            p for (p, t), part in self.tables.items() if t == table and key(row) in part.rows
        )

    def add(self, page: int, caption: str, grid: list[list[str]]) -> None:
        found = _CAPTION.search(caption)
        if found is None or len(grid) < 2:
            raise DocumentUnreadable(f"page {page}: a table without a caption or rows")
        header, *body = grid
        part = ParsedTable(columns={key(name): i for i, name in enumerate(header[1:])})
        part.rows = {key(row[0]): list(row[1:]) for row in body if row}
        self.tables[(page, int(found.group(1)))] = part


def parse_pdf(data: bytes) -> ParsedDocument:
    parsed = ParsedDocument()
    with pdfplumber.open(io.BytesIO(data)) as pdf:
        for page in pdf.pages:
            for table in page.find_tables():
                top = table.bbox[1]
                band = (0, max(0.0, top - _CAPTION_BAND), page.width, top)
                caption = page.crop(band).extract_text() or ""
                grid = [[cell or "" for cell in row] for row in table.extract()]
                parsed.add(page.page_number, caption, grid)
    return parsed


class _HTMLTables(HTMLParser):
    """Collects ``<table>`` captions and cells, each under its ``div.page``'s number."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parsed = ParsedDocument()
        self.page = 0
        self.caption: list[str] | None = None
        self.grid: list[list[str]] | None = None
        self.text: list[str] | None = None
        self.caption_text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "div" and values.get("class") == "page":
            self.page = int(values.get("data-page") or 0)
        elif tag == "table":
            self.grid, self.caption_text = [], ""
        elif tag == "caption":
            self.caption = []
        elif tag == "tr" and self.grid is not None:
            self.grid.append([])
        elif tag in ("td", "th") and self.grid is not None:
            self.text = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "caption" and self.caption is not None:
            self.caption_text, self.caption = "".join(self.caption), None
        elif tag in ("td", "th") and self.grid and self.text is not None:
            self.grid[-1].append("".join(self.text).strip())
            self.text = None
        elif tag == "table" and self.grid is not None:
            self.parsed.add(self.page, self.caption_text, self.grid)
            self.grid = None

    def handle_data(self, data: str) -> None:
        if self.text is not None:
            self.text.append(data)
        elif self.caption is not None:
            self.caption.append(data)


def parse_html(data: bytes) -> ParsedDocument:
    reader = _HTMLTables()
    reader.feed(data.decode("utf-8"))
    reader.close()
    return reader.parsed


def parse(data: bytes, fmt: str) -> ParsedDocument:
    if fmt == "pdf":
        return parse_pdf(data)
    if fmt == "html":
        return parse_html(data)
    raise DocumentUnreadable(f"unknown document format {fmt!r}")
