"""Which services a stack runs, and how each is built from its settings.

Built-in services are listed here; packages add theirs through the
``temper.services`` entry-point group (value ``module:ServiceClass``).  A
service class takes one settings dataclass whose ``runtime`` field holds the
shared :class:`~services.runtime.settings.RuntimeSettings`.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from services.runtime.service import Service
from services.runtime.settings import from_env

ENTRY_POINT_GROUP = "temper.services"


class UnknownService(LookupError):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown service {name!r}; known: {', '.join(known) or 'none'}")
        self.name = name


@dataclass(frozen=True)
class ServiceEntry:
    name: str
    #: ``module:Class`` of the Service subclass.
    target: str

    def load(self) -> type[Service]:
        module, _, attr = self.target.partition(":")
        cls = getattr(importlib.import_module(module), attr)
        if not (inspect.isclass(cls) and issubclass(cls, Service)):
            raise TypeError(f"{self.target} is not a Service subclass")
        return cls


BUILTIN: Mapping[str, ServiceEntry] = {
    "control": ServiceEntry("control", "services.control:ControlService"),
    "feeder": ServiceEntry("feeder", "services.feeder.service:FeederService"),
    "sandbox": ServiceEntry("sandbox", "services.sandbox.service:SandboxService"),
    "validator": ServiceEntry("validator", "services.validator.service:ValidatorService"),
    "generator": ServiceEntry("generator", "services.generator.service:GeneratorService"),
    "replay": ServiceEntry("replay", "services.replay.service:ReplayService"),
    "learner": ServiceEntry("learner", "services.learner.service:LearnerService"),
}


#: ``temper up``'s first ``/metrics`` port (see :func:`metrics_ports`).
METRICS_PORT_BASE = 9460


def metrics_ports(names: Iterable[str], base: int = METRICS_PORT_BASE) -> dict[str, int]:
    """The ``/metrics`` port of each service: ``base`` plus its place among the built-in
    services sorted by name (control, generator, learner, replay, sandbox, validator), then
    the other registered ones sorted by name.  The place does not depend on which services
    run, so one static scrape config fits every stack; ``base`` 0 gives each a free port.
    """
    builtin = sorted(BUILTIN)
    order = [*builtin, *sorted(set(entries()) - set(builtin))]
    return {name: base + order.index(name) if base else 0 for name in names}


def entries() -> dict[str, ServiceEntry]:
    found = dict(BUILTIN)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(point.name, ServiceEntry(point.name, point.value))
    return found


def lookup(name: str) -> ServiceEntry:
    known = entries()
    if name not in known:
        raise UnknownService(name, sorted(known))
    return known[name]


def settings_type(cls: type[Service]) -> type[Any]:
    """The settings dataclass a service's constructor takes (its first parameter's annotation)."""
    hints = typing.get_type_hints(cls.__init__)
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    return hints[params[0]]  # type: ignore[no-any-return]


def build(name: str, environ: Mapping[str, str]) -> Service:
    """Construct service ``name`` with settings from ``TEMPER_<NAME>_*`` (then ``TEMPER_*``)."""
    cls = lookup(name).load()
    settings_cls = settings_type(cls)
    settings = from_env(settings_cls, f"TEMPER_{name.upper()}_", environ)
    return cls(settings)
