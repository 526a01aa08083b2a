"""The report as data: sections of paragraphs, tables, figures and alerts.

Sections are built once and rendered twice over (HTML, markdown), so the two formats
cannot disagree on a figure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.evaluation.report.tier_reports import Interval


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""


@dataclass(frozen=True)
class Figure:
    caption: str
    png: bytes


@dataclass(frozen=True)
class Alert:
    """A finding to act on (a reward-hacking flag), shown apart from plain text."""

    text: str


Block = str | Table | Figure | Alert


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    blocks: tuple[Block, ...]
    #: What the section could not show, each with how to get it.
    missing: tuple[str, ...] = ()


def figures(enabled: bool, caption: str, draw: Callable[[], bytes | None]) -> list[Block]:
    """The figure ``draw`` makes, if figures are wanted and there is something to plot."""
    if not enabled:
        return []
    png = draw()
    return [] if png is None else [Figure(caption, png)]


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def interval(value: Interval | None) -> str:
    if value is None:
        return "-"
    return f"{value.value:.1%} [{value.low:.1%}, {value.high:.1%}]"


def change(before: float | None, after: float | None, percent: bool = True) -> str:
    if before is None or after is None:
        return "-"
    delta = after - before
    return f"{100 * delta:+.1f} pts" if percent else f"{delta:+.3g}"


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"
