"""A report as a PDF (reportlab) and as an HTML filing, page for page as the layout says.

Both outputs are byte-for-byte the same for the same report (reportlab's ``invariant``
mode leaves out the creation date and random file id), so a file regenerated from a
seed is the file the question was asked about.
"""

from __future__ import annotations

import html
import io
from typing import Final

from reportlab.lib.pagesizes import LETTER
from reportlab.pdfgen.canvas import Canvas

from services.domains.documents.layout import Page, Slice, Text, pages
from services.domains.documents.model import Report

_PAGE_WIDTH: Final[float] = float(LETTER[0])
_PAGE_HEIGHT: Final[float] = float(LETTER[1])
_LEFT: Final = 50.0
_TOP: Final = 50.0
_LINE: Final = 15.0
_WIDTH: Final = _PAGE_WIDTH - 2 * _LEFT
_LABEL_WIDTH: Final = 190.0


def _y(line: int) -> float:
    """The PDF y of the top of grid line ``line`` (PDF y grows upwards)."""
    return _PAGE_HEIGHT - _TOP - line * _LINE


def _table(canvas: Canvas, item: Slice, line: int) -> int:
    table = item.table
    canvas.setFont("Helvetica-Oblique", 9)
    canvas.drawString(_LEFT, _y(line) - 11, table.caption(item.continued))
    rows = [table.header(), *(r.cells() for r in table.rows[item.start : item.stop])]
    width = (_WIDTH - _LABEL_WIDTH) / len(table.columns)
    edges = [
        _LEFT,
        _LEFT + _LABEL_WIDTH,
        *(_LEFT + _LABEL_WIDTH + width * (i + 1) for i in range(len(table.columns))),
    ]
    top = line + 1
    canvas.setLineWidth(0.5)
    for index, cells in enumerate(rows):
        canvas.setFont("Helvetica-Bold" if index == 0 else "Helvetica", 8)
        baseline = _y(top + index) - 11
        canvas.drawString(edges[0] + 3, baseline, cells[0])
        for column, cell in enumerate(cells[1:], start=1):
            canvas.drawRightString(edges[column + 1] - 3, baseline, cell)
    for row in range(len(rows) + 1):
        canvas.line(edges[0], _y(top + row), edges[-1], _y(top + row))
    for edge in edges:
        canvas.line(edge, _y(top), edge, _y(top + len(rows)))
    return line + 1 + len(rows) + 1


def _page(canvas: Canvas, page: Page) -> None:
    line = 0
    for item in page.items:
        if isinstance(item, Slice):
            line = _table(canvas, item, line)
            continue
        canvas.setFont("Helvetica-Bold" if item.heading else "Helvetica", 9)
        canvas.drawString(_LEFT, _y(line) - 11, item.text)
        line += 1
    canvas.setFont("Helvetica", 8)
    canvas.drawCentredString(_PAGE_WIDTH / 2, 24, f"Page {page.number}")


def pdf_bytes(report: Report) -> bytes:
    buffer = io.BytesIO()
    canvas = Canvas(buffer, pagesize=LETTER, invariant=True)
    canvas.setTitle(f"{report.company} - quarterly report")
    for page in pages(report):
        _page(canvas, page)
        canvas.showPage()
    canvas.save()
    return buffer.getvalue()


def _html_table(item: Slice) -> list[str]:
    table = item.table
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in table.header())
    out = [f"<table><caption>{html.escape(table.caption(item.continued))}</caption>"]
    out.append(f"<thead><tr>{head}</tr></thead><tbody>")
    for row in table.rows[item.start : item.stop]:
        label, *values = row.cells()
        cells = "".join(f"<td>{value}</td>" for value in values)
        out.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
    out.append("</tbody></table>")
    return out


def _html_page(page: Page) -> list[str]:
    out = [f'<div class="page" data-page="{page.number}">']
    for item in page.items:
        if isinstance(item, Text):
            tag = "h2" if item.heading else "p"
            out.append(f"<{tag}>{html.escape(item.text)}</{tag}>")
        else:
            out.extend(_html_table(item))
    out.append(f'<p class="page-number">Page {page.number}</p></div>')
    return out


def html_bytes(report: Report) -> bytes:
    title = html.escape(f"{report.company} - quarterly report")
    out = ['<!DOCTYPE html><html><head><meta charset="utf-8">', f"<title>{title}</title>"]
    out.append("<style>.page { page-break-after: always; }</style></head><body>")
    for page in pages(report):
        out.extend(_html_page(page))
    out.append("</body></html>")
    return "\n".join(out).encode()


def render(report: Report, fmt: str) -> bytes:
    if fmt == "pdf":
        return pdf_bytes(report)
    if fmt == "html":
        return html_bytes(report)
    raise ValueError(f"unknown document format {fmt!r}")
