"""The run's domains: each ``[[domains]]`` entry loaded from its source, the eval domains,
and one domains config folder that gives every service of the stack the same registry.

A source is ``builtin`` (the built-in registry), a domains config file or folder (the
format of deploy/domains/domains.toml) or a JSONL file (one problem a line).  The services
read one domains config, so the run writes one folder for all its sources: a file that
asks for the built-ins, a copy of each config file with its relative ``path`` parameters
made absolute, and a file declaring each JSONL domain.  Loading that folder is the check
that the sources do not declare a name twice.
"""

from __future__ import annotations

import shutil
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.cli.runconfig import toml_text
from services.cli.runconfig.reading import key_error
from services.cli.runconfig.settings import BUILTIN, DomainEntry, RunConfigError, TrainPlan
from services.domains import (
    ConfigError,
    Domain,
    DomainError,
    DomainRegistry,
    UnknownDomain,
    load_registry,
)
from services.domains import jsonl as jsonl_kind
from services.domains.config import config_files
from services.domains.tool_use import with_recovery


@dataclass(frozen=True, kw_only=True)
class RunDomains:
    """The training mix (domain, weight) and the domains evaluated on their held-out split."""

    train: tuple[tuple[Domain, float], ...]
    eval: tuple[Domain, ...]
    #: The folder every service reads its domains from; None: the built-ins serve the run.
    config: Path | None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(domain.name for domain, _ in self.train)


def load_domains(plan: TrainPlan, folder: Path) -> RunDomains:
    """Every domain of ``plan`` loaded (the domains config written to ``folder`` when a
    source is not ``builtin``); a RunConfigError names the entry and the problem."""
    registries: dict[str, DomainRegistry] = {}
    train = tuple(
        (_domain(plan, index, entry, registries), entry.weight)
        for index, entry in enumerate(plan.domains)
    )
    if plan.warmup_recovery_steps:
        _check_recovery(plan, train)
    found = [_eval_domain(plan, name, train, registries) for name in plan.eval_domains]
    sources = [entry.source for entry in plan.domains] + [source for _, source in found]
    config = None
    if set(sources) != {BUILTIN}:
        config = write_config(plan.domains, sources, folder)
        _check_combined(plan, config)
    return RunDomains(train=train, eval=tuple(domain for domain, _ in found), config=config)


def _check_recovery(plan: TrainPlan, train: tuple[tuple[Domain, float], ...]) -> None:
    if any(with_recovery(domain, 0.0) for domain, _ in train):
        return
    raise key_error(
        plan,
        "warmup.recovery_steps",
        f"{plan.warmup_recovery_steps}: no domain of the mix has tool calls to show a recovery "
        f"from ({', '.join(d.name for d, _ in train)}); a tool_use domain does",
    )


def _entry_key(plan: TrainPlan, index: int, field: str) -> str:
    if plan.origin("domains") == "--domain":
        return "--domain"
    return f"domains[{index}].{field}"


def _domain(
    plan: TrainPlan, index: int, entry: DomainEntry, registries: dict[str, DomainRegistry]
) -> Domain:
    source_key = _entry_key(plan, index, "source")
    if entry.is_jsonl:
        try:
            return jsonl_kind.domain(entry.name, {**entry.params, "path": entry.source})
        except DomainError as error:
            raise _error(plan, source_key, str(error)) from None
    registry = _registry(plan, source_key, entry.source, registries)
    try:
        return registry.get(entry.name)
    except UnknownDomain:
        raise _error(
            plan,
            _entry_key(plan, index, "name"),
            f"unknown domain {entry.name!r} in {_describe(entry.source)} "
            f"({len(registry)} domains; list them: {_listing(entry.source)})",
        ) from None


def _registry(
    plan: TrainPlan, key: str, source: str, registries: dict[str, DomainRegistry]
) -> DomainRegistry:
    if source not in registries:
        try:
            registries[source] = load_registry(None if source == BUILTIN else Path(source))
        except (ConfigError, DomainError) as error:
            raise _error(plan, key, str(error)) from None
    return registries[source]


def _eval_domain(
    plan: TrainPlan,
    name: str,
    train: tuple[tuple[Domain, float], ...],
    registries: dict[str, DomainRegistry],
) -> tuple[Domain, str]:
    """A training domain, else a domain of a training source or of the built-ins; and
    the source it came from."""
    for (domain, _), entry in zip(train, plan.domains, strict=True):
        if domain.name == name:
            return domain, entry.source
    sources = [e.source for e in plan.domains if not e.is_jsonl] + [BUILTIN]
    for source in dict.fromkeys(sources):
        registry = _registry(plan, "eval.domains", source, registries)
        if name in registry:
            return registry.get(name), source
    searched = ", ".join(_describe(s) for s in dict.fromkeys(sources))
    raise _error(
        plan, "eval.domains", f"unknown domain {name!r} (not a training domain, nor in {searched})"
    )


def _describe(source: str) -> str:
    return "the built-in domains" if source == BUILTIN else source


def _listing(source: str) -> str:
    if source == BUILTIN:
        return "temper domains --local"
    return f"temper domains --local --domains-config {source}"


def _error(plan: TrainPlan, key: str, problem: str) -> RunConfigError:
    origin = plan.origin("eval.domains" if key == "eval.domains" else "domains")
    if origin.startswith("--"):
        return RunConfigError("command line", key if key.startswith("--") else origin, problem)
    where = origin.rpartition(": ")[0] if ": " in origin else origin
    return RunConfigError(where, key, problem)


# ---------------------------------------------------------------- the stack's domains config


def write_config(entries: tuple[DomainEntry, ...], sources: list[str], folder: Path) -> Path:
    """``folder`` made to declare exactly what ``sources`` and the JSONL entries declare."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if BUILTIN in sources:
        (folder / "00-builtin.toml").write_text("include_builtins = true\n")
    configs = [s for s in dict.fromkeys(sources) if s != BUILTIN and not s.endswith(".jsonl")]
    for number, source in enumerate(configs, start=1):
        for file in config_files(Path(source)):
            copy = folder / f"{number:02d}-{file.name}"
            copy.write_text(_absolute_paths(file))
    declared = [_jsonl_declaration(e) for e in entries if e.is_jsonl]
    if declared:
        (folder / "99-jsonl.toml").write_text(toml_text.dumps({"domain": declared}))
    return folder


def _absolute_paths(file: Path) -> str:
    """The config file's text with each relative ``path`` parameter taken from its folder."""
    raw = tomllib.loads(file.read_text(encoding="utf-8"))
    for table in [*raw.get("domain", []), *raw.get("family", [])]:
        params = table.get("params", {})
        if isinstance(params.get("path"), str):
            params["path"] = str(file.parent / params["path"])
        matrix = table.get("matrix", {})
        if isinstance(matrix.get("path"), list):
            matrix["path"] = [
                str(file.parent / p) if isinstance(p, str) else p for p in matrix["path"]
            ]
    return toml_text.dumps(raw)


def _jsonl_declaration(entry: DomainEntry) -> Mapping[str, Any]:
    return {"name": entry.name, "kind": "jsonl", "params": {**entry.params, "path": entry.source}}


def _check_combined(plan: TrainPlan, folder: Path) -> None:
    try:
        load_registry(folder)
    except (ConfigError, DomainError) as error:
        where = plan.origin("domains").rpartition(": ")[0] or "command line"
        raise RunConfigError(where, "domains", f"the sources do not combine: {error}") from None
