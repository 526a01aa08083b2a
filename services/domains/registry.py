"""The set of domains a stack serves: built-ins, a config file, and installed plugins.

Plugins register through the ``temper.domains`` entry-point group; an entry's
value (``module:attr``) names a Domain, an iterable of Domains, or a callable
without arguments that returns either.  A config file's ``kind`` may also be a
``module:factory`` taking ``(name, params)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Final

from services.domains.api import Domain, DomainError, UnknownDomain
from services.domains.builtin import KINDS, Kind, builtin_domains
from services.domains.config import config_files, load_file

ENTRY_POINT_GROUP: Final = "temper.domains"


class DomainRegistry:
    """Domains by name, in declaration order; immutable once built."""

    def __init__(self, domains: Iterable[Domain]) -> None:
        self._domains: dict[str, Domain] = {}
        for domain in domains:
            if domain.name in self._domains:
                raise DomainError(domain.name, "is declared twice")
            self._domains[domain.name] = domain

    def get(self, name: str) -> Domain:
        try:
            return self._domains[name]
        except KeyError:
            raise UnknownDomain(name, len(self._domains)) from None

    def names(self) -> list[str]:
        return list(self._domains)

    def __contains__(self, name: object) -> bool:
        return name in self._domains

    def __iter__(self) -> Iterator[Domain]:
        return iter(self._domains.values())

    def __len__(self) -> int:
        return len(self._domains)

    def __repr__(self) -> str:
        return f"DomainRegistry({len(self)} domains)"


def resolve(target: str) -> Any:
    """The object ``module:attr`` names."""
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ValueError(f"{target!r} is not of the form module:attribute")
    return getattr(importlib.import_module(module), attr)


def kind(name: str) -> Kind:
    """A built-in kind, or a ``module:factory`` one."""
    if name in KINDS:
        return KINDS[name]
    if ":" not in name:
        raise DomainError(name, f"unknown kind (built-in: {', '.join(KINDS)}; or module:factory)")
    try:
        factory = resolve(name)
    except (ImportError, AttributeError, ValueError) as error:
        raise DomainError(name, f"cannot load kind: {error}") from None
    if not callable(factory):
        raise DomainError(name, "kind is not callable")
    return factory  # type: ignore[no-any-return]


def _as_domains(found: Any, where: str) -> list[Domain]:
    if callable(found) and not isinstance(found, Domain):
        found = found()
    items = [found] if isinstance(found, Domain) else list(found)
    for item in items:
        if not isinstance(item, Domain):
            raise DomainError(where, f"plugin gave {type(item).__name__}, not a Domain")
    return items


def plugin_domains() -> list[Domain]:
    domains: list[Domain] = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        domains.extend(_as_domains(point.load(), f"entry point {point.name}"))
    return domains


def load_registry(config: Path | None = None, *, plugins: bool = True) -> DomainRegistry:
    """The built-in domains when ``config`` is None, else what the file (or folder) declares.

    Installed plugins are added unless ``plugins`` is false.  Raises ``ConfigError``
    or ``DomainError`` on a bad declaration, duplicate names included.
    """
    domains: list[Domain] = []
    builtins = config is None
    for path in config_files(config) if config is not None else []:
        declared, wants_builtins = load_file(path, kind)
        domains.extend(declared)
        builtins = builtins or wants_builtins
    if builtins:
        domains = builtin_domains() + domains
    if plugins:
        domains.extend(plugin_domains())
    return DomainRegistry(domains)
