"""Every section of the report, in page order."""

from __future__ import annotations

from services.evaluation.report import feeder_section, sections, system_sections
from services.evaluation.report.document import Section
from services.evaluation.report.run_data import RunData
from services.evaluation.watch import review

#: Section ids in page order; the tests check each one is there.
SECTION_IDS = (
    "summary",
    "reward",
    "heldout",
    "staleness",
    "throughput",
    "feeder",
    "sandbox",
    "tiers",
    "watch",
)


def build(run: RunData, draw: bool) -> tuple[Section, ...]:
    """The report's sections; ``draw`` False leaves the figures out (markdown has none)."""
    found = review(run)
    return (
        sections.summary(run, found),
        sections.reward(run, draw),
        sections.heldout(run, draw),
        sections.staleness(run, draw),
        sections.throughput(run, draw),
        feeder_section.feeder(run),
        system_sections.sandbox(run, draw),
        system_sections.tiers(run),
        system_sections.watch_section(found),
    )
