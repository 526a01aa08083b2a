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
    "sandbox": ServiceEntry("sandbox", "services.sandbox.service:SandboxService"),
    "validator": ServiceEntry("validator", "services.validator.service:ValidatorService"),
    "generator": ServiceEntry("generator", "services.generator.service:GeneratorService"),
    "replay": ServiceEntry("replay", "services.replay.service:ReplayService"),
    "learner": ServiceEntry("learner", "services.learner.service:LearnerService"),
}
#: Built in, but not part of every stack: ``temper up`` starts one only when it is named or
#: its setting (the value) is set; compose and the manifests leave it out.
ON_REQUEST: Mapping[str, tuple[ServiceEntry, str]] = {
    "feeder": (
        ServiceEntry("feeder", "services.feeder.service:FeederService"),
        "TEMPER_FEEDER_MIX",
    ),
    "gateway": (
        ServiceEntry("gateway", "services.gateway.service:GatewayService"),
        "TEMPER_GATEWAY_KEYS_FILE",
    ),
}


#: The services whose ``/metrics`` port is fixed by their place here (the feeder came later:
#: it goes after them, so their ports did not move).
PORT_ORDER: tuple[str, ...] = ("control", "generator", "learner", "replay", "sandbox", "validator")


def default_services(environ: Mapping[str, str]) -> tuple[str, ...]:
    """What ``temper up`` starts when no service is named: every registered service, less
    those on request whose setting ``environ`` does not set."""
    return tuple(
        name
        for name in sorted(entries())
        if name not in ON_REQUEST or environ.get(ON_REQUEST[name][1])
    )


#: ``temper up``'s first ``/metrics`` port (see :func:`metrics_ports`).
METRICS_PORT_BASE = 9460


def metrics_ports(names: Iterable[str], base: int = METRICS_PORT_BASE) -> dict[str, int]:
    """The ``/metrics`` port of each service: ``base`` plus its place among the built-in
    services in ``PORT_ORDER`` (control, generator, learner, replay, sandbox, validator), then
    the other registered ones sorted by name.  The place does not depend on which services
    run, so one static scrape config fits every stack; ``base`` 0 gives each a free port.
    """
    order = [*PORT_ORDER, *sorted(set(entries()) - set(PORT_ORDER))]
    return {name: base + order.index(name) if base else 0 for name in names}


def entries() -> dict[str, ServiceEntry]:
    found = {**BUILTIN, **{name: entry for name, (entry, _) in ON_REQUEST.items()}}
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
