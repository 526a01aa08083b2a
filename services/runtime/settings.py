"""Settings: one frozen dataclass per service, built from the environment only by the CLI.

Variables are named ``<PREFIX><FIELD>`` in upper case; a field of a nested dataclass
``limits`` reads ``<PREFIX>LIMITS_<FIELD>``.  The runtime group alone also falls back to
the shared ``TEMPER_<FIELD>``, so that one ``TEMPER_NATS_URL`` reaches every service.

A nested dataclass declared with ``metadata=FLAT`` is a *flat group*: it only gathers
fields in the code, and its fields read the variables they would read were they the
parent's own (``TEMPER_LEARNER_LR`` for ``LearnerSettings.trainer.lr``).  A field
declared with ``metadata=NOT_FROM_ENV`` (``{"env": False}``) is never read from the
environment.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

#: ``metadata`` of a flat group, a nested settings dataclass whose fields read the
#: parent's variables: ``trainer: TrainerConfig = field(default_factory=TrainerConfig,
#: metadata=FLAT)`` makes ``trainer.lr`` read ``<PREFIX>LR``, not ``<PREFIX>TRAINER_LR``.
FLAT: Mapping[str, bool] = types.MappingProxyType({"flat": True})
#: ``metadata`` of a field the environment never sets (one built from other settings).
NOT_FROM_ENV: Mapping[str, bool] = types.MappingProxyType({"env": False})


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeSettings:
    """What every service needs to be a service: the bus, its identity, its timings."""

    #: One server, or every server of a cluster comma-separated (the client fails over).
    nats_url: str = "nats://127.0.0.1:4222"
    #: Copies of each stream this service declares: 3 on a three-server cluster.
    stream_replicas: int = 1
    #: Distinguishes processes of one service; empty means ``<host>-<pid>``.
    instance: str = ""
    #: On stop, in-flight work gets this long to finish before it is handed back.
    grace_s: float = 30.0
    heartbeat_s: float = 5.0
    stats_s: float = 10.0
    #: Prometheus ``/metrics`` port on 127.0.0.1; ``None`` serves none, 0 picks a free port.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    connect_timeout_s: float = 5.0
    reconnect_wait_s: float = 1.0
    log_level: str = "info"

    def instance_id(self) -> str:
        return self.instance or f"{socket.gethostname()}-{os.getpid()}"


class SettingsError(ValueError):
    """An environment variable could not be parsed into its settings field."""


class DuplicateVariable(TypeError):
    """Two fields of one settings class would read the same variable: a programming error."""


@dataclasses.dataclass(frozen=True)
class _Scope:
    """Where the fields of one dataclass read: ``<prefix><FIELD>``, else ``<fallback><FIELD>``."""

    prefix: str
    fallback: str | None
    #: The fallback of the runtime group's fields (``TEMPER_``).
    shared: str

    def inner(self, field: dataclasses.Field[Any], kind: type[Any]) -> _Scope:
        if field.metadata.get("flat", False):
            return self
        # Only the runtime fields are shared by every service: another nested group
        # falling back too would let ``TEMPER_TIMEOUT_S`` set both of the sandbox's
        # ``defaults.timeout_s`` and ``maxima.timeout_s``.
        fallback = self.shared if issubclass(kind, RuntimeSettings) else None
        return _Scope(f"{self.prefix}{field.name.upper()}_", fallback, self.shared)

    def names(self, field: dataclasses.Field[Any]) -> list[str]:
        """The variables ``field`` reads, the first set winning."""
        name = field.name.upper()
        keys = [f"{self.prefix}{name}"]
        if self.fallback is not None and self.fallback != self.prefix:
            keys.append(f"{self.fallback}{name}")
        return keys


def from_env(cls: type[T], prefix: str, environ: Mapping[str, str], fallback: str = "TEMPER_") -> T:
    """Build ``cls`` from ``environ``; fields without a variable keep their defaults.

    A field reads ``<prefix><FIELD>``; a field of a nested dataclass reads
    ``<prefix><NESTED>_<FIELD>`` (and, in the runtime group, then the shared
    ``<fallback><FIELD>``); a field of a flat group (``metadata=FLAT``) reads what a
    field of its parent would.
    """
    variables(cls, prefix, fallback)  # two fields on one variable fail before any is read
    return _build(cls, _Scope(prefix, None, fallback), environ)


def variables(cls: type[Any], prefix: str, fallback: str = "TEMPER_") -> dict[str, str]:
    """Every variable ``from_env`` reads for ``cls``, with the field it sets
    (``trainer.loss.clip_eps``); raises :class:`DuplicateVariable` when two fields
    would read one variable."""
    found: dict[str, str] = {}
    for path, names in _leaves(cls, _Scope(prefix, None, fallback), ""):
        for name in names:
            if name in found:
                raise DuplicateVariable(
                    f"{cls.__name__}: fields {found[name]!r} and {path!r} both read {name}"
                )
            found[name] = path
    return found


def _nested(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _fields(cls: type[Any]) -> Iterator[tuple[dataclasses.Field[Any], Any]]:
    """The fields of ``cls`` the environment may set, each with its resolved type."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if not field.metadata.get("env", True):
            continue
        kind = hints[field.name]
        if field.metadata.get("flat", False) and not _nested(kind):
            raise TypeError(f"{cls.__name__}.{field.name}: a flat group must be a dataclass")
        yield field, kind


def _leaves(cls: type[Any], scope: _Scope, path: str) -> Iterator[tuple[str, list[str]]]:
    for field, kind in _fields(cls):
        where = f"{path}{field.name}"
        if _nested(kind):
            yield from _leaves(kind, scope.inner(field, kind), f"{where}.")
        else:
            yield where, scope.names(field)


def _build(cls: type[T], scope: _Scope, environ: Mapping[str, str], base: T | None = None) -> T:
    """``base`` (else ``cls()`` with its defaults) with the fields the environment sets."""
    values: dict[str, Any] = {}
    for field, kind in _fields(cls):
        if _nested(kind):
            # A nested field starts from its own default (``maxima`` is not ``Limits()``),
            # and the environment overrides single fields of it.
            start = getattr(base, field.name) if base is not None else _default(field)
            values[field.name] = _build(kind, scope.inner(field, kind), environ, start)
            continue
        found = _lookup(environ, scope.names(field))
        if found is not None:
            var, raw = found
            values[field.name] = _parse(raw, kind, var)
    try:
        if base is not None:
            return dataclasses.replace(base, **values)  # type: ignore[type-var]
        return cls(**values)
    except SettingsError:
        raise
    except ValueError as error:
        # A check of the dataclass itself (``micro_batch must be at least 1``): reported
        # as bad settings, under the variables that set them.
        raise SettingsError(f"{scope.prefix}*: {error}") from None


def _default(field: dataclasses.Field[Any]) -> Any:
    """The value ``field`` takes when none is given, or None when it has no default."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    if field.default is not dataclasses.MISSING:
        return field.default
    return None


def _lookup(environ: Mapping[str, str], keys: list[str]) -> tuple[str, str] | None:
    """(variable, value) of the first of ``keys`` that is set."""
    for key in keys:
        if key in environ:
            return key, environ[key]
    return None


def _parse(raw: str, kind: Any, var: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        if raw.strip().lower() in ("", "none", "null"):
            return None
        return _parse(raw, options[0], var)
    if origin is typing.Literal:
        allowed = typing.get_args(kind)
        if raw not in allowed:
            choices = ", ".join(repr(a) for a in allowed)
            raise SettingsError(f"{var}={raw!r}: not one of {choices}")
        return raw
    if origin is tuple:
        item = typing.get_args(kind)[0]
        return tuple(_parse(part.strip(), item, var) for part in raw.split(",") if part.strip())
    try:
        return _scalar(raw, kind)
    except ValueError as error:
        raise SettingsError(f"{var}={raw!r}: {error}") from None


def _scalar(raw: str, kind: Any) -> Any:
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise ValueError("expected a boolean (1/0, true/false, yes/no, on/off)")
        return lowered in ("1", "true", "yes", "on")
    if kind in (int, float, str, Path):
        return kind(raw)
    raise ValueError(f"unsupported settings type {kind!r}")
