"""The rlimits a run gets: the agent's options, a request's override, applied in the child."""

from __future__ import annotations

import resource
from dataclasses import dataclass, replace
from typing import Any

from .common import BadRequest, get_field

DEFAULT_NOFILE = 256
DEFAULT_FSIZE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    nofile: int
    fsize_bytes: int
    memory_bytes: int | None = None
    nproc: int | None = None


def parse_limits(raw: Any, base: Limits, container: bool) -> Limits:
    if raw is None:
        return base
    if not isinstance(raw, dict):
        raise BadRequest("limits: expected an object")
    values: dict[str, int] = {}
    for key in ("memory_bytes", "nproc", "nofile", "fsize_bytes"):
        value = get_field(raw, key, int, None)
        if value is not None:
            if value <= 0:
                raise BadRequest(f"limits.{key}: must be positive")
            values[key] = value
    if container and "nproc" in values:
        raise BadRequest("limits.nproc: not in a container (RLIMIT_NPROC is per uid host-wide)")
    return replace(base, **values)


def _set_limit(which: int, value: int) -> None:
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def apply_limits(limits: Limits) -> None:
    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_NOFILE, limits.nofile)
    _set_limit(resource.RLIMIT_FSIZE, limits.fsize_bytes)
    if limits.memory_bytes is not None:
        _set_limit(resource.RLIMIT_AS, limits.memory_bytes)
    if limits.nproc is not None:
        _set_limit(resource.RLIMIT_NPROC, limits.nproc)
