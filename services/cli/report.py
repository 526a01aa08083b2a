"""``temper report RUN_DIR``: what a training run did, as one self-contained HTML page.

Reward per domain, held-out accuracy (and tiered figures where the run has them),
staleness, throughput, sandbox and failure figures, start-vs-end tiers and the
reward-hacking watch.  ``--markdown`` prints the same tables, without plots, for a
terminal or a CI log (or writes them to ``--out``); the pictures of rendered parts it
writes as PNG files into a folder beside the report and links.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.cli.common import CliError

if TYPE_CHECKING:
    from services.evaluation.report.document import Section

#: The folder of a markdown report's figures when it goes to stdout.
FIGURES = "report-figures"


def register(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="a run directory as one HTML page (or markdown): reward, held-out, watch"
    )
    report.add_argument("run_dir", type=Path, help="run directory written by temper train")
    report.add_argument(
        "--out",
        type=Path,
        help="file to write (default RUN_DIR/report.html; with --markdown, stdout)",
    )
    report.add_argument(
        "--markdown", action="store_true", help="markdown tables instead (stdout unless --out)"
    )
    report.set_defaults(run=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from services.evaluation.report import html
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
        return _markdown(build(run, draw=False), title, run_dir, args.out)
    out: Path = args.out or run_dir / "report.html"
    out.write_text(html.render(build(run, draw=True), title))
    print(out)
    return 0


def _markdown(sections: Sequence[Section], title: str, run_dir: Path, out: Path | None) -> int:
    """Markdown to ``out`` (its figures in ``<stem>-figures/`` beside it) or to stdout (its
    figures in ``RUN_DIR/report-figures/``, linked by that path)."""
    from services.evaluation.report.markdown import FigureFiles, render

    if out is None:
        files = FigureFiles(run_dir / FIGURES, str(run_dir / FIGURES))
        print(render(sections, title, files), end="")
        return 0
    folder = f"{out.stem}-figures"
    out.write_text(render(sections, title, FigureFiles(out.parent / folder, folder)))
    print(out)
    return 0
