"""``temper ledger check RUN_DIR``: was every rollout trained exactly once?"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from services.cli.common import CliError

#: Ids listed per problem in the text report (``--json`` lists them all).
_SHOWN = 10


def register(commands: Any) -> None:
    ledger = commands.add_parser("ledger", help="the learner's provenance ledger")
    actions = ledger.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser(
        "check",
        help="report rollouts trained twice, leased but never committed, or committed but lost",
    )
    check.add_argument("run_dir", type=Path, help="run directory, learner directory or ledger")
    check.add_argument(
        "--running",
        action="store_true",
        help="the learner still runs: rollouts not committed yet are not a problem",
    )
    check.add_argument("--json", action="store_true", help="the whole report as JSON")
    check.set_defaults(run=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from services.learner.ledger_check import check, find_ledger

    try:
        report = check(find_ledger(args.run_dir))
    except (FileNotFoundError, KeyError, ValueError) as error:
        raise CliError(str(error), 2) from error
    if args.running:
        report.uncommitted = []
    if args.json:
        print(json.dumps(report.summary(), indent=2))
    else:
        _print(report.summary())
    return 0 if report.ok else 1


def _print(summary: dict[str, Any]) -> None:
    print(f"ledger  {summary['ledger']}")
    print(
        f"steps {summary['steps']} surviving, {summary['abandoned_steps']} abandoned by "
        f"{summary['resumes']} resumes; rollouts trained {summary['trained_rollouts']}, "
        f"committed {summary['committed_rollouts']}; torn lines {summary['torn_lines']}"
    )
    for key, words in (
        ("trained_twice", "trained twice"),
        ("uncommitted", "leased, trained, never committed"),
        ("lost", "committed but only trained in an abandoned lineage"),
        ("version_errors", "versions not strictly increasing"),
    ):
        items = summary[key]
        if items:
            more = f" (+{len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
            print(f"PROBLEM {len(items)} {words}: {', '.join(items[:_SHOWN])}{more}")
    print("ok: every rollout trained exactly once" if summary["ok"] else "NOT OK")
