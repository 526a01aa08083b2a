"""The report as markdown tables, for a terminal or a CI log: the figures are left out."""

from __future__ import annotations

from collections.abc import Sequence

from services.evaluation.report.document import Alert, Block, Figure, Section, Table


def render(sections: Sequence[Section], title: str) -> str:
    parts = [f"# {title}"]
    parts.extend(_section(s) for s in sections)
    return "\n\n".join(parts) + "\n"


def _section(section: Section) -> str:
    parts = [f"## {section.title}"]
    parts.extend(text for b in section.blocks if (text := _block(b)))
    parts.extend(f"> Missing: {_inline(m)}" for m in section.missing)
    return "\n\n".join(parts)


def _block(block: Block) -> str:
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Figure):
        return ""
    if isinstance(block, Alert):
        return f"**FLAG** {_inline(block.text)}"
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
