"""Domains declared in TOML: single domains, and families that expand over a parameter matrix.

::

    [defaults]              # optional: overrides applied to every domain of the file
    samples = 4

    [[domain]]
    name = "arithmetic"
    kind = "arithmetic"     # a built-in kind, or "package.module:factory"
    params = { op = "add", digits = 1 }

    [[family]]              # one domain per combination of the matrix values
    name = "arith-{op}-d{digits}"
    kind = "arithmetic"
    matrix = { op = ["add", "sub", "mul"], digits = [1, 2, 3] }
    params = { style = "boxed" }   # fixed; the matrix values are merged in

Any declaration may override a domain's fields: ``prompt``, ``validators``,
``tools``, ``sandbox``, ``eval_fraction``, ``max_tokens``, ``max_turns``,
``samples``, ``tier``, ``pass_threshold``, ``share_weight``, ``retry``,
``description``.  A ``path`` parameter is resolved against the folder of the file that declares it.
"""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from protocol.messages import SandboxLimits
from services.domains.api import Domain, DomainError, ValidatorSpec
from services.domains.retry import RetryPolicy

Scalar = str | int | float | bool
KindLookup = Callable[[str], Callable[[str, Mapping[str, Any]], Domain]]


class ConfigError(ValueError):
    """A domains config file cannot be used; the message names the file and what is wrong."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class _Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class PromptTable(_Config):
    system: str | None = None
    template: str | None = None


class ValidatorTable(_Config):
    kind: str
    weight: float = 1.0
    params: dict[str, Any] = {}
    name: str = ""


class Overrides(_Config):
    prompt: PromptTable | None = None
    validators: list[ValidatorTable] | None = None
    tools: list[str] | None = None
    #: SandboxLimits' fields; checked in ``apply``, where a misspelt one is an error (the
    #: protocol message itself lets unknown fields pass, for newer peers).
    sandbox: dict[str, Any] | None = None
    eval_fraction: float | None = None
    max_tokens: int | None = None
    max_turns: int | None = None
    samples: int | None = None
    tier: int | None = None
    pass_threshold: float | None = None
    share_weight: float | None = None
    #: RetryPolicy's fields (max_attempts, backoff_s, backoff_max_s, on).
    retry: dict[str, Any] | None = None
    overlong: str | None = None
    description: str | None = None


class Declaration(Overrides, kw_only=True):
    name: str
    kind: str
    params: dict[str, Any] = {}


class Family(Declaration, kw_only=True):
    matrix: dict[str, list[Scalar]]


class ConfigFile(_Config):
    defaults: Overrides = msgspec.field(default_factory=Overrides)
    domain: list[Declaration] = []
    family: list[Family] = []
    #: Also serve the built-in domains (``load_registry(None)``'s set).
    include_builtins: bool = False


def read_config(path: Path) -> ConfigFile:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(path, f"cannot read: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(path, f"not valid TOML: {error}") from None
    try:
        return msgspec.convert(raw, ConfigFile)
    except msgspec.ValidationError as error:
        raise ConfigError(path, str(error)) from None


def config_files(path: Path) -> list[Path]:
    """A file, or every ``*.toml`` of a folder in name order."""
    if not path.is_dir():
        return [path]
    files = sorted(path.glob("*.toml"))
    if not files:
        raise ConfigError(path, "the folder holds no *.toml files")
    return files


def expand(family: Family) -> Iterator[Declaration]:
    """One declaration per combination of the matrix values, in matrix order."""
    keys = list(family.matrix)
    fields = {f: getattr(family, f) for f in family.__struct_fields__ if f != "matrix"}
    for values in itertools.product(*(family.matrix[k] for k in keys)):
        combination = dict(zip(keys, values, strict=True))
        try:
            name = family.name.format(**combination)
        except (KeyError, IndexError, ValueError) as error:
            raise DomainError(family.name, f"name template cannot be filled: {error!r}") from None
        params = {**family.params, **combination}
        yield Declaration(**{**fields, "name": name, "params": params})


def build(declaration: Declaration, defaults: Overrides, base: Path, kinds: KindLookup) -> Domain:
    params = dict(declaration.params)
    if isinstance(params.get("path"), str):
        params["path"] = str(base / params["path"])
    domain = kinds(declaration.kind)(declaration.name, params)
    return apply(apply(domain, defaults), declaration)


#: Fields an override replaces as they are.
_SCALARS: tuple[str, ...] = ("eval_fraction", "max_tokens", "max_turns", "samples", "tier")
_SCALARS += ("pass_threshold", "share_weight", "overlong", "description")


def apply(domain: Domain, overrides: Overrides) -> Domain:
    """``domain`` with the fields ``overrides`` sets (re-checked by ``Domain.__post_init__``)."""
    changes: dict[str, Any] = {
        name: getattr(overrides, name) for name in _SCALARS if getattr(overrides, name) is not None
    }
    if overrides.tools is not None:
        changes["tools"] = tuple(overrides.tools)
    if overrides.sandbox is not None:
        changes["sandbox"] = sandbox_limits(domain.name, overrides.sandbox)
    if overrides.retry is not None:
        changes["retry"] = retry_policy(domain.name, overrides.retry)
    if overrides.prompt is not None:
        prompt = {
            k: v for k, v in msgspec.structs.asdict(overrides.prompt).items() if v is not None
        }
        changes["prompt"] = dataclasses.replace(domain.prompt, **prompt)
    if overrides.validators is not None:
        changes["validators"] = tuple(
            ValidatorSpec(kind=v.kind, weight=v.weight, params=v.params, name=v.name)
            for v in overrides.validators
        )
    return dataclasses.replace(domain, **changes) if changes else domain


def sandbox_limits(domain: str, table: Mapping[str, Any]) -> SandboxLimits:
    """A ``sandbox`` table as SandboxLimits; an unknown or invalid limit names itself."""
    known = SandboxLimits.__struct_fields__
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise DomainError(
            domain, f"unknown sandbox limit {', '.join(unknown)} (known: {', '.join(known)})"
        )
    try:
        return msgspec.convert(dict(table), SandboxLimits)
    except msgspec.ValidationError as error:
        raise DomainError(domain, f"sandbox limits: {error}") from None


def retry_policy(domain: str, table: Mapping[str, Any]) -> RetryPolicy:
    """A ``retry`` table as a RetryPolicy; a misspelt or invalid entry names itself."""
    try:
        return msgspec.convert(dict(table), RetryPolicy)
    except msgspec.ValidationError as error:
        raise DomainError(domain, f"retry: {error}") from None


def load_file(path: Path, kinds: KindLookup) -> tuple[list[Domain], bool]:
    """The domains one file declares, and whether it asks for the built-ins too."""
    config = read_config(path)
    declarations = list(config.domain)
    try:
        for family in config.family:
            declarations.extend(expand(family))
        domains = [build(d, config.defaults, path.parent, kinds) for d in declarations]
    except DomainError as error:
        raise ConfigError(path, str(error)) from None
    return domains, config.include_builtins
