"""The report's feeder section: per domain what the feeder drew, filtered and pooled."""

from __future__ import annotations

from services.evaluation.report.document import Block, Section, Table
from services.evaluation.report.run_data import RunData
from services.runtime.domain_figures import by_domain

#: (column, figure) in table order.
COLUMNS = (
    ("drawn", "drawn"),
    ("done", "done"),
    ("filtered (all alike)", "filtered"),
    ("passed over", "passed_over"),
    ("epoch", "epoch"),
    ("easy", "pool_easy"),
    ("normal", "pool_normal"),
    ("hard", "pool_hard"),
)


def feeder(run: RunData) -> Section:
    blocks: list[Block] = []
    for entry in run.service("feeder"):
        rows = tuple(
            (name, *(f"{figures.get(figure, 0):.0f}" for _, figure in COLUMNS))
            for name, figures in sorted(by_domain(entry.values).items())
        )
        caption = f"Feeder {entry.key}: tasks per domain and problems per pool (stats.json)"
        blocks.append(Table(("domain", *(c for c, _ in COLUMNS)), rows, caption))
    missing = () if blocks else ("stats.json has no feeder entry: no feeder service ran",)
    return Section("feeder", "Feeder: draw, filtering and pools", tuple(blocks), missing)
