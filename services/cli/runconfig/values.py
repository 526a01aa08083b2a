"""Checking one value of a run config: its type and its allowed range, or an error naming both."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from protocol import subjects
from protocol.errors import SubjectError
from services.cli.runconfig.settings import (
    BUILTIN,
    DOMAIN_KEYS,
    DomainEntry,
    RunConfigError,
    Setting,
)

_TYPE_NAMES: dict[type, str] = {
    int: "a whole number",
    float: "a number",
    Path: "a path (string)",
    tuple: "a list of domain names",
    str: "a string",
}


def convert(setting: Setting, value: Any, where: str, key: str, base: Path) -> Any:
    """``value`` as the setting's type, checked; relative paths are taken from ``base``."""
    typed = _typed(setting, value, where, key, base)
    if typed is not None and not setting.check(typed):
        raise RunConfigError(where, key, f"{value!r} is not allowed ({setting.allowed})")
    return typed


def _typed(setting: Setting, value: Any, where: str, key: str, base: Path) -> Any:
    kind = setting.kind
    wrong = RunConfigError(where, key, f"must be {_TYPE_NAMES[kind]}, not {value!r}")
    # bool is an int to Python, never to a reader of the file.
    if isinstance(value, bool):
        raise wrong
    if kind is int:
        if not isinstance(value, int):
            raise wrong
        return value
    if kind is float:
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise wrong
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise wrong
        return value
    if kind is Path:
        if not isinstance(value, str) or not value:
            raise wrong
        return (base / value).resolve()
    if not isinstance(value, list) or not value:
        raise RunConfigError(where, key, f"must be a non-empty list of domain names, not {value!r}")
    return tuple(domain_name(item, where, f"{key}[{i}]") for i, item in enumerate(value))


def domain_name(value: Any, where: str, key: str) -> str:
    try:
        return subjects.token(value, "domain name")
    except SubjectError:
        raise RunConfigError(
            where, key, f"{value!r} is not a domain name (letters, digits, _ and -)"
        ) from None


def weight(value: Any, where: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RunConfigError(where, key, f"must be a number > 0, not {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise RunConfigError(where, key, f"{value!r} is not allowed (a number > 0)")
    return float(value)


def source(value: Any, where: str, key: str, base: Path) -> str:
    """``builtin``, or the absolute path of a domains config or JSONL file that exists."""
    if not isinstance(value, str) or not value:
        raise RunConfigError(
            where, key, f"must be 'builtin' or a path (domains TOML, folder, JSONL), not {value!r}"
        )
    if value == BUILTIN:
        return value
    path = (base / value).resolve()
    if not path.exists():
        raise RunConfigError(
            where,
            key,
            f"{path} does not exist ('builtin', or a domains TOML "
            "file or folder, or a .jsonl file)",
        )
    return str(path)


def domain_table(table: Any, where: str, key: str, base: Path) -> DomainEntry:
    """One ``[[domains]]`` table of a file."""
    if not isinstance(table, dict):
        raise RunConfigError(where, key, f"must be a table ({', '.join(DOMAIN_KEYS)})")
    unknown = sorted(set(table) - set(DOMAIN_KEYS))
    if unknown:
        raise RunConfigError(
            where, f"{key}.{unknown[0]}", f"unknown key (allowed: {', '.join(DOMAIN_KEYS)})"
        )
    if "name" not in table:
        raise RunConfigError(where, f"{key}.name", "is required")
    entry = DomainEntry(
        name=domain_name(table["name"], where, f"{key}.name"),
        weight=weight(table.get("weight", 1.0), where, f"{key}.weight"),
        source=source(table.get("source", BUILTIN), where, f"{key}.source", base),
        params=table.get("params", {}),
    )
    _check_params(entry, where, f"{key}.params")
    return entry


def _check_params(entry: DomainEntry, where: str, key: str) -> None:
    if not isinstance(entry.params, dict):
        raise RunConfigError(where, key, f"must be a table, not {entry.params!r}")
    if entry.params and not entry.is_jsonl:
        raise RunConfigError(
            where,
            key,
            "only a JSONL source takes params (style, validator); a domains "
            "config declares its domains' params itself",
        )
    if "path" in entry.params:
        raise RunConfigError(where, f"{key}.path", "the JSONL file is the entry's source")


def domain_flag(spec: str, base: Path) -> DomainEntry:
    """``--domain NAME[=WEIGHT][@SOURCE]``."""
    head, _, where_from = spec.partition("@")
    name, has_weight, weight_text = head.partition("=")
    flag = "--domain"
    try:
        value: Any = float(weight_text) if has_weight else 1.0
    except ValueError:
        value = weight_text
    return DomainEntry(
        name=domain_name(name, "command line", flag),
        weight=weight(value, "command line", f"{flag} {spec}"),
        source=source(where_from or BUILTIN, "command line", f"{flag} {spec}", base),
    )
