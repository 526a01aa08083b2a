"""A run config from its defaults, a TOML file and the command line, in that order.

A file's relative paths (``model``, a domain's ``source``) are taken from the file's
folder, so a config names its data where it lies; ``run_dir`` and every path given as a
flag are taken from the working directory, as the flags always were.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from services.cli.runconfig import values
from services.cli.runconfig.settings import (
    BY_KEY,
    DEFAULT_WARMUP_STEPS,
    SETTINGS,
    TABLES,
    DomainEntry,
    RunConfigError,
    TrainPlan,
)

COMMAND_LINE = "command line"
#: The domain ``temper train`` trains on when neither a file nor a flag names one.
DEFAULT_DOMAIN = "arithmetic_sum4"


class Layer:
    """The values one source (file or command line) sets, with where each came from."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.origins: dict[str, str] = {}
        self.domains: tuple[DomainEntry, ...] | None = None

    def set(self, key: str, value: Any, origin: str) -> None:
        self.values[key] = value
        self.origins[key] = origin


def read_file(path: Path) -> Layer:
    """The settings a run config file sets; a RunConfigError names the file and key."""
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise RunConfigError(where, "", f"cannot read: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise RunConfigError(where, "", f"not valid TOML: {error}") from None
    layer = Layer()
    base = path.resolve().parent
    for key, value in raw.items():
        if key == "domains":
            layer.domains = _domain_tables(value, where, base)
            layer.origins["domains"] = f"{where}: domains"
        elif key in TABLES:
            _table(layer, key, value, where, base)
        else:
            _setting(layer, key, value, where, base)
    return layer


def _domain_tables(value: Any, where: str, base: Path) -> tuple[DomainEntry, ...]:
    if not isinstance(value, list) or not value:
        raise RunConfigError(where, "domains", "must be one or more [[domains]] tables")
    entries = tuple(
        values.domain_table(table, where, f"domains[{i}]", base) for i, table in enumerate(value)
    )
    _no_repeats(entries, where, "domains")
    return entries


def _no_repeats(entries: tuple[DomainEntry, ...], where: str, key: str) -> None:
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        if entry.name in seen:
            raise RunConfigError(where, f"{key}[{index}].name", f"{entry.name!r} is named twice")
        seen.add(entry.name)


def _table(layer: Layer, table: str, value: Any, where: str, base: Path) -> None:
    if not isinstance(value, dict):
        raise RunConfigError(where, table, f"must be a table ([{table}]), not {value!r}")
    for name, item in value.items():
        _setting(layer, f"{table}.{name}", item, where, base)


def _setting(layer: Layer, key: str, value: Any, where: str, base: Path) -> None:
    setting = BY_KEY.get(key)
    if setting is None:
        raise RunConfigError(where, key, f"unknown key ({_allowed(key)})")
    # run_dir is where output goes: from the working directory, as the flag.
    origin_base = Path.cwd() if key == "run_dir" else base
    layer.set(key, values.convert(setting, value, where, key, origin_base), f"{where}: {key}")


def _allowed(key: str) -> str:
    table = key.rpartition(".")[0]
    if table in TABLES:
        names = [s.name for s in SETTINGS if s.table == table]
        return f"allowed in [{table}]: {', '.join(names)}"
    top = [s.key for s in SETTINGS if not s.table]
    return f"allowed: {', '.join([*top, 'domains'])}; tables: {', '.join(TABLES)}"


def read_flags(args: argparse.Namespace) -> Layer:
    """The settings given on the command line (a flag left out is None)."""
    layer = Layer()
    cwd = Path.cwd()
    for setting in SETTINGS:
        given = getattr(args, setting.field, None)
        if given is None:
            continue
        if setting.kind is tuple:
            given = [name.strip() for name in str(given).split(",") if name.strip()]
        elif setting.kind is Path:
            given = str(given)
        value = values.convert(setting, given, COMMAND_LINE, setting.flag, cwd)
        layer.set(setting.key, value, setting.flag)
    if args.domain:
        entries = tuple(values.domain_flag(spec, cwd) for spec in args.domain)
        _no_repeats(entries, COMMAND_LINE, "--domain")
        layer.domains = entries
        layer.origins["domains"] = "--domain"
    return layer


def resolve(file: Layer | None, flags: Layer) -> TrainPlan:
    """Defaults, then the file, then the flags; checked as a whole."""
    chosen: dict[str, Any] = {s.key: s.default for s in SETTINGS}
    origins: dict[str, str] = {}
    domains: tuple[DomainEntry, ...] = (DomainEntry(name=DEFAULT_DOMAIN),)
    for layer in (file, flags):
        if layer is None:
            continue
        chosen.update(layer.values)
        origins.update(layer.origins)
        domains = layer.domains if layer.domains is not None else domains
    chosen["run_dir"] = Path(chosen["run_dir"]).resolve()
    if chosen["model"] is not None and "warmup.steps" not in origins:
        chosen["warmup.steps"] = 0
    if chosen["eval.domains"] is None:
        chosen["eval.domains"] = tuple(entry.name for entry in domains)
    fields = {BY_KEY[key].field: value for key, value in chosen.items()}
    plan = TrainPlan(domains=domains, origins=origins, **fields)
    check(plan)
    return plan


def check(plan: TrainPlan) -> None:
    """What no single value shows: settings that contradict each other or this machine."""
    if plan.minutes == 0 and plan.max_steps == 0:
        raise key_error(
            plan,
            "budget.minutes",
            "0 with budget.max_steps = 0: the run would never end (allowed: either > 0)",
        )
    if plan.model is not None:
        _check_model(plan)
    if plan.generators != 1:
        _refuse_instances(plan, "instances.generator", plan.generators)
    if plan.validators != 1:
        _refuse_instances(plan, "instances.validator", plan.validators)


def _check_model(plan: TrainPlan) -> None:
    assert plan.model is not None
    if not (plan.model / "config.json").is_file():
        raise key_error(plan, "model", f"{plan.model} is not a model directory (no config.json)")
    if plan.warmup_steps:
        raise key_error(
            plan,
            "warmup.steps",
            f"{plan.warmup_steps}: the supervised warm-up is for the built-in tiny policy "
            f"(default {DEFAULT_WARMUP_STEPS}); with a model, leave it out or set 0",
        )
    if plan.warmup_recovery_steps:
        raise key_error(
            plan,
            "warmup.recovery_steps",
            f"{plan.warmup_recovery_steps}: the recovery steps follow the built-in tiny "
            "policy's warm-up; with a model, leave it out or set 0",
        )


def _refuse_instances(plan: TrainPlan, key: str, count: int) -> None:
    service = key.rpartition(".")[2]
    raise key_error(
        plan,
        key,
        f"{count}: the embedded stack runs one {service} process (allowed: 1); start more "
        f"beside it with `temper serve {service}` against nats://127.0.0.1:{plan.nats_port}",
    )


def key_error(plan: TrainPlan, key: str, problem: str) -> RunConfigError:
    """An error about ``key``, naming the file or the flag that set it."""
    origin = plan.origin(key)
    if origin.startswith("--"):
        return RunConfigError(COMMAND_LINE, origin, problem)
    where, _, dotted = origin.rpartition(": ")
    return RunConfigError(where or origin, dotted or key, problem)
