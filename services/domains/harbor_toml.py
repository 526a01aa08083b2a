"""A Harbor task's ``task.toml``: its limits, checked, and its free-form metadata.

The keys read (Harbor's schema 1.x; others are ignored, as Harbor ignores them):

* ``version`` or ``schema_version``: a string;
* ``[metadata]`` and ``[task]``: free-form tables, kept as they are;
* ``[verifier] timeout_sec`` and ``[agent] timeout_sec``: seconds, above 0 (Harbor's
  default 600 when absent);
* ``[environment]``: ``build_timeout_sec``; ``cpus``; ``memory_mb`` and ``storage_mb``, or
  the older ``memory`` and ``storage`` strings (``"2G"``, ``"512M"``); ``gpus``;
  ``allow_internet``; ``docker_image``.

What the sandbox cannot give is refused here rather than failing later: GPUs, and a
prebuilt ``docker_image`` in place of ``environment/Dockerfile``.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from protocol.messages import SandboxLimits

#: Harbor's default for each of its timeouts, in seconds.
DEFAULT_TIMEOUT_S: Final = 600.0
#: The older size strings: a number and a unit (K, M, G or T, binary multiples of a MB).
_SIZE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])i?B?\s*$", re.IGNORECASE)
_MB_PER_UNIT: Final = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024.0}
_TABLES: Final = ("metadata", "task", "verifier", "agent", "environment")


class TomlProblem(ValueError):
    """What is wrong with a task.toml (the caller adds the task's path)."""


@dataclass(frozen=True, kw_only=True)
class HarborLimits:
    """The limits a task declares; ``None``: not declared (the sandbox's default applies)."""

    verifier_timeout_s: float = DEFAULT_TIMEOUT_S
    #: The agent's whole time on the task (all its turns): no per-command sandbox limit.
    agent_timeout_s: float = DEFAULT_TIMEOUT_S
    build_timeout_s: float = DEFAULT_TIMEOUT_S
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None

    def sandbox(self) -> SandboxLimits:
        """The limits of the task's sandbox sessions (commands keep the service's timeout)."""
        return SandboxLimits(cpus=self.cpus, memory_mb=self.memory_mb, disk_mb=self.storage_mb)

    def verifier(self) -> SandboxLimits:
        """The limits of the run of ``tests/test.sh``: the sandbox's, timed by the verifier's."""
        limits = self.sandbox()
        return SandboxLimits(
            timeout_s=self.verifier_timeout_s,
            cpus=limits.cpus,
            memory_mb=limits.memory_mb,
            disk_mb=limits.disk_mb,
        )


@dataclass(frozen=True, kw_only=True)
class TaskToml:
    limits: HarborLimits
    metadata: Mapping[str, Any]


def parse_task_toml(text: str) -> TaskToml:
    """The limits and metadata of a task.toml's text, or :class:`TomlProblem` saying why not."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        # The decoder's message ends with "(at line L, column C)".
        raise TomlProblem(f"task.toml is not valid TOML: {error}") from None
    for key in ("version", "schema_version"):
        if key in data and not isinstance(data[key], str):
            raise TomlProblem(f"task.toml: {key} must be a string, not {_shown(data[key])}")
    tables = {name: _table(data, name) for name in _TABLES}
    environment = tables["environment"]
    _refuse_unsupported(environment)
    limits = HarborLimits(
        verifier_timeout_s=_seconds(tables["verifier"], "verifier", "timeout_sec"),
        agent_timeout_s=_seconds(tables["agent"], "agent", "timeout_sec"),
        build_timeout_s=_seconds(environment, "environment", "build_timeout_sec"),
        cpus=_cpus(environment),
        memory_mb=_megabytes(environment, "memory"),
        storage_mb=_megabytes(environment, "storage"),
    )
    return TaskToml(limits=limits, metadata=tables["metadata"])


def _table(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise TomlProblem(f"task.toml: [{name}] must be a table, not {_shown(value)}")
    return value


def _number(table: Mapping[str, Any], where: str) -> float | None:
    """The key's number, or None when absent; booleans and strings are refused."""
    key = where.split(".")[1]
    if key not in table:
        return None
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TomlProblem(f"task.toml: {where} must be a number, not {_shown(value)}")
    if not math.isfinite(value) or value <= 0:
        raise TomlProblem(f"task.toml: {where} must be a positive number, not {value}")
    return float(value)


def _seconds(table: Mapping[str, Any], section: str, key: str) -> float:
    value = _number(table, f"{section}.{key}")
    return DEFAULT_TIMEOUT_S if value is None else value


def _cpus(environment: Mapping[str, Any]) -> float | None:
    return _number(environment, "environment.cpus")


def _megabytes(environment: Mapping[str, Any], what: str) -> int | None:
    """``<what>_mb`` (a number of MB) or the older ``<what>`` string; not both."""
    if f"{what}_mb" in environment and what in environment:
        raise TomlProblem(f"task.toml: environment sets both {what}_mb and {what}; keep one")
    if what not in environment:
        value = _number(environment, f"environment.{what}_mb")
        return None if value is None else math.ceil(value)
    size = environment[what]
    match = _SIZE.match(size) if isinstance(size, str) else None
    if match is None:
        raise TomlProblem(
            f'task.toml: environment.{what} must be a size such as "2G" or "512M", '
            f"not {_shown(size)}"
        )
    megabytes = math.ceil(float(match[1]) * _MB_PER_UNIT[match[2].upper()])
    if megabytes <= 0:
        raise TomlProblem(f"task.toml: environment.{what} {size!r} is not a positive size")
    return megabytes


def _refuse_unsupported(environment: Mapping[str, Any]) -> None:
    gpus = environment.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise TomlProblem(f"task.toml: environment.gpus must be a count, not {_shown(gpus)}")
    if gpus > 0:
        raise TomlProblem(f"task.toml: the task needs {gpus} GPU(s); the sandbox has none")
    internet = environment.get("allow_internet", False)
    if not isinstance(internet, bool):
        raise TomlProblem(
            f"task.toml: environment.allow_internet must be true or false, not {_shown(internet)}"
        )
    if "docker_image" in environment:
        raise TomlProblem(
            "task.toml: environment.docker_image (a prebuilt image) is not supported; "
            "give environment/Dockerfile FROM the sandbox image instead"
        )


def _shown(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"
