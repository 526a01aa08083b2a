"""``temper report RUN_DIR``: what a training run did, as one self-contained HTML page.

Reward per domain, held-out accuracy (and tiered figures where the run has them),
staleness, throughput, sandbox and failure figures, start-vs-end tiers and the
reward-hacking watch.  ``--markdown`` prints the same tables, without figures, for a
terminal or a CI log.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from services.cli.common import CliError


def register(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="a run directory as one HTML page (or markdown): reward, held-out, watch"
    )
    report.add_argument("run_dir", type=Path, help="run directory written by temper train")
    report.add_argument("--out", type=Path, help="HTML file to write (default RUN_DIR/report.html)")
    report.add_argument(
        "--markdown", action="store_true", help="print markdown tables to stdout instead"
    )
    report.set_defaults(run=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from services.evaluation.report import html, markdown
    from services.evaluation.report.build import build
    from services.evaluation.report.run_data import METRICS, load

    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        raise CliError(f"no run directory at {run_dir}", 2)
    run = load(run_dir)
    if not run.steps:
        raise CliError(
            f"{run_dir / METRICS} has no learner steps: is {run_dir} a run directory "
            "(temper train --run-dir) that trained at least one step?",
            2,
        )
    title = f"Temper run report: {run_dir.resolve().name}"
    if args.markdown:
        print(markdown.render(build(run, draw=False), title), end="")
        return 0
    out: Path = args.out or run_dir / "report.html"
    out.write_text(html.render(build(run, draw=True), title))
    print(out)
    return 0
