"""Turn a request's optional limits into resolved ones, refusing anything above the maxima."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from protocol.errors import ErrorCode
from protocol.messages import SandboxLimits
from services.runtime.errors import RequestRejected
from services.sandbox.settings import Limits


def resolve(
    requested: SandboxLimits, defaults: Limits, maxima: Limits, path: str = "$.limits"
) -> Limits:
    """Defaults fill what the request leaves out; a value over its maximum is a typed error."""
    chosen: dict[str, Any] = {}
    for spec in fields(Limits):
        value = getattr(requested, spec.name)
        if value is None:
            continue
        ceiling = getattr(maxima, spec.name)
        if value > ceiling:
            raise RequestRejected(
                ErrorCode.BAD_REQUEST,
                f"{spec.name} {value} is above this service's maximum {ceiling}",
                field=f"{path}.{spec.name}",
            )
        chosen[spec.name] = value
    return replace(defaults, **chosen)


#: What is fixed when a sandbox is created: memory, pids, cpus, disk, the user code runs
#: as, and the image when it is not the configured one ("" when it is).
Shape = tuple[int, int, float, int, str, str]


def container_shape(limits: Limits, user: str, image: str = "") -> Shape:
    """The limits fixed when a container is created, its user and a task image's id;
    execs that share them may share containers."""
    return (limits.memory_mb, limits.pids, limits.cpus, limits.disk_mb, user, image)
