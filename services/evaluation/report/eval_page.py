"""``temper eval``'s report for people: ``report.html`` and ``report.md`` beside
``report.json``, with each domain's tier figures and the pictures of rendered parts.

The same document as ``temper report`` (:mod:`document`), for one policy instead of a
run: no plots, so no matplotlib; the pictures were drawn by the validator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from services.evaluation.report import html, markdown
from services.evaluation.report.document import Section, Table
from services.evaluation.report.parts import preview_blocks
from services.evaluation.report.system_sections import TIER_ROWS, shown_value
from services.evaluation.report.tier_reports import DomainTiers, TierReport, parse_tier_report

HTML: Final = "report.html"
MARKDOWN: Final = "report.md"
#: The markdown report's figures, a folder beside it.
FIGURES: Final = "report-figures"


def eval_sections(report: TierReport) -> tuple[Section, ...]:
    tables = tuple(_domain_table(name, domain) for name, domain in report.domains.items())
    sections = [Section("tiers", "Tiers", tables)]
    parts = preview_blocks(report)
    if parts:
        sections.append(Section("parts", "Rendered parts", tuple(parts)))
    return tuple(sections)


def _domain_table(name: str, domain: DomainTiers) -> Table:
    rows = tuple(
        (tier, label, shown_value(value))
        for tier, label, pick in TIER_ROWS
        if (value := pick(domain)) is not None
    )
    return Table(("tier", "figure", "value"), rows, name)


def write_pages(raw: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """``report.html`` and ``report.md`` (its figures in ``report-figures/``) in ``out``."""
    report = parse_tier_report(raw)
    title = f"Temper evaluation: {report.policy} ({report.label})"
    sections = eval_sections(report)
    page, notes = out / HTML, out / MARKDOWN
    page.write_text(html.render(sections, title))
    files = markdown.FigureFiles(out / FIGURES, FIGURES)
    notes.write_text(markdown.render(sections, title, files))
    return page, notes
