"""Settings: one frozen dataclass per service, built from the environment only by the CLI.

Variables are named ``<PREFIX><FIELD>`` in upper case; a nested dataclass field
``runtime`` reads ``<PREFIX>RUNTIME_<FIELD>`` and falls back to the shared
``TEMPER_<FIELD>`` so that one ``TEMPER_NATS_URL`` reaches every service.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


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


def from_env(cls: type[T], prefix: str, environ: Mapping[str, str], fallback: str = "TEMPER_") -> T:
    """Build ``cls`` from ``environ``; fields without a variable keep their defaults.

    A field reads ``<prefix><FIELD>``; a field of a nested dataclass reads
    ``<prefix><NESTED>_<FIELD>``, else the shared ``<fallback><FIELD>``.
    """
    return _build(cls, prefix, environ, None, fallback)


def _build(
    cls: type[T],
    prefix: str,
    environ: Mapping[str, str],
    own: str | None,
    shared: str,
    base: T | None = None,
) -> T:
    """``base`` (else ``cls()`` with its defaults) with the fields the environment sets."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        kind = hints[field.name]
        name = field.name.upper()
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            # A nested field starts from its own default (``maxima`` is not ``Limits()``),
            # and the environment overrides single fields of it.
            start = getattr(base, field.name) if base is not None else _default(field)
            values[field.name] = _build(kind, f"{prefix}{name}_", environ, shared, shared, start)
            continue
        found = _lookup(environ, name, prefix, own)
        if found is not None:
            var, raw = found
            values[field.name] = _parse(raw, kind, var)
    if base is not None:
        return dataclasses.replace(base, **values)  # type: ignore[type-var]
    return cls(**values)


def _default(field: dataclasses.Field[Any]) -> Any:
    """The value ``field`` takes when none is given, or None when it has no default."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    if field.default is not dataclasses.MISSING:
        return field.default
    return None


def _lookup(
    environ: Mapping[str, str], name: str, prefix: str, fallback: str | None
) -> tuple[str, str] | None:
    """(variable, value) of the first one set: ``<prefix><NAME>``, then ``<fallback><NAME>``."""
    keys = [f"{prefix}{name}"] + ([f"{fallback}{name}"] if fallback is not None else [])
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
