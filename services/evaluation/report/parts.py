"""The pictures a tier report carries (CAD renders), as report figures.

They are shown whether or not the report draws plots: they were drawn by the
validator when the answers were judged, so showing them costs nothing here.
"""

from __future__ import annotations

from services.evaluation.report.document import Block, Figure
from services.evaluation.report.tier_reports import TierReport


def preview_blocks(report: TierReport) -> list[Block]:
    """A lead-in and one figure per preview, domain by domain; nothing without previews."""
    figures: list[Block] = [
        Figure(f"{name}: {preview.caption}", preview.png)
        for name, domain in report.domains.items()
        for preview in domain.previews
    ]
    if not figures:
        return []
    lead = (
        f"Rendered parts at {report.label}: the best and the worst reward of each domain "
        "whose validator draws what it judged."
    )
    return [lead, *figures]
