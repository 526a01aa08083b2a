"""The report as markdown tables, for a terminal or a CI log.

Markdown cannot hold a picture, so figures are written as PNG files into a folder
beside the report (:class:`FigureFiles`) and linked; without one they are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.evaluation.report.document import Alert, Block, Figure, Section, Table


@dataclass(frozen=True)
class FigureFiles:
    """Where figures go as PNG files, and that folder as the report's links name it."""

    folder: Path
    #: The folder relative to where the markdown is read (or as given, for stdout).
    link: str

    def save(self, name: str, png: bytes) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / name).write_bytes(png)
        return f"{self.link}/{name}"


def render(sections: Sequence[Section], title: str, files: FigureFiles | None = None) -> str:
    parts = [f"# {title}"]
    parts.extend(_section(s, files) for s in sections)
    return "\n\n".join(parts) + "\n"


def _section(section: Section, files: FigureFiles | None) -> str:
    parts = [f"## {section.title}"]
    figures = 0
    for block in section.blocks:
        if isinstance(block, Figure):
            figures += 1
            text = _figure(block, files, f"{section.id}-{figures}.png")
        else:
            text = _block(block)
        if text:
            parts.append(text)
    parts.extend(f"> Missing: {_inline(m)}" for m in section.missing)
    return "\n\n".join(parts)


def _figure(figure: Figure, files: FigureFiles | None, name: str) -> str:
    if files is None:
        return ""
    link = files.save(name, figure.png)
    caption = _inline(figure.caption)
    alt = caption.replace("[", "(").replace("]", ")")
    return f"![{alt}]({link})\n\n*{caption}*"


def _block(block: Block) -> str:
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Alert):
        return f"**FLAG** {_inline(block.text)}"
    if isinstance(block, Figure):
        return ""
    return _inline(block)


def _table(table: Table) -> str:
    lines = [f"**{_inline(table.caption)}**", ""] if table.caption else []
    lines.append(_row(table.headers))
    lines.append("|" + "|".join("---" for _ in table.headers) + "|")
    lines.extend(_row(row) for row in table.rows)
    return "\n".join(lines)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(_inline(c).replace("|", "\\|") for c in cells) + " |"


def _inline(text: str) -> str:
    # One line per paragraph or cell: a newline would end a table row early.
    return " ".join(text.split())
