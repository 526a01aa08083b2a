"""``temper train``'s run config: one TOML file (``--config``) whose every setting is also a
flag, a flag given on the command line winning over the file.

::

    plan = plan_of(args)               # defaults < RUN.toml < flags, checked
    print(to_toml(plan))               # the resolved config (--print-config)
    domains = load_domains(plan, run_dir / "domains")

Unknown keys and bad values raise a RunConfigError naming the file (or flag), the dotted
key and what is allowed, before anything starts.  The commented example with every key
is deploy/runs/arithmetic.toml.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from services.cli.runconfig import reading, toml_text
from services.cli.runconfig.domains import RunDomains, load_domains
from services.cli.runconfig.settings import (
    BUILTIN,
    SETTINGS,
    TABLES,
    DomainEntry,
    RunConfigError,
    TrainPlan,
)

__all__ = [
    "BUILTIN",
    "DomainEntry",
    "RunConfigError",
    "RunDomains",
    "TrainPlan",
    "add_flags",
    "load_domains",
    "plan_of",
    "to_toml",
]


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--print-config`` and one flag per setting (default None: not given)."""
    parser.add_argument("--config", type=Path, help="a run config (TOML; deploy/runs/*.toml)")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (defaults < --config < flags) as TOML and exit",
    )
    parser.add_argument(
        "--domain",
        action="append",
        metavar="NAME[=WEIGHT][@SOURCE]",
        help="a domain of the mix (repeat for several; replaces the file's [[domains]]); "
        "SOURCE: builtin (default), a domains TOML file or folder, or a .jsonl file",
    )
    for setting in SETTINGS:
        kind: Any = setting.kind if setting.kind in (int, float) else str
        parser.add_argument(
            setting.flag,
            dest=setting.field,
            type=kind,
            default=None,
            help=f"{setting.help} [{setting.key}; default {_default(setting)}]",
        )


def _default(setting: Any) -> str:
    if setting.key == "eval.domains":
        return "the training domains"
    if setting.key == "model":
        return "the tiny policy"
    return str(setting.default)


def plan_of(args: argparse.Namespace) -> TrainPlan:
    """The run's plan: defaults, then ``--config``, then the flags given."""
    file = reading.read_file(args.config) if args.config is not None else None
    return reading.resolve(file, reading.read_flags(args))


def to_toml(plan: TrainPlan) -> str:
    """The plan as a run config that reads back to the same plan."""
    data: dict[str, Any] = {}
    tables: dict[str, dict[str, Any]] = {name: {} for name in TABLES}
    for setting in SETTINGS:
        value = getattr(plan, setting.field)
        if value is None:
            continue
        value = str(value) if isinstance(value, Path) else value
        value = list(value) if isinstance(value, tuple) else value
        target = tables[setting.table] if setting.table else data
        target[setting.name] = value
    data["domains"] = [_entry(entry) for entry in plan.domains]
    data.update(tables)
    header = "# temper train: the resolved run config (defaults < --config < flags)\n"
    if plan.model is None:
        header += "# model: not set, the built-in tiny policy warmed up on the domains\n"
    return header + toml_text.dumps(data)


def _entry(entry: DomainEntry) -> dict[str, Any]:
    table: dict[str, Any] = {"name": entry.name, "weight": entry.weight, "source": entry.source}
    if entry.params:
        table["params"] = dict(entry.params)
    return table
