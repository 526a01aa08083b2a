"""Typed reading of a domain family's parameters, with errors that name the domain and key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.domains.api import DomainError


class Params:
    """Read each parameter once; :meth:`done` rejects the ones nobody read (typos)."""

    def __init__(self, domain: str, values: Mapping[str, Any]) -> None:
        self.domain = domain
        self._values = dict(values)
        self._read: set[str] = set()

    def _get(self, key: str, default: Any) -> Any:
        self._read.add(key)
        return self._values.get(key, default)

    def _fail(self, key: str, message: str) -> DomainError:
        return DomainError(self.domain, f"parameter {key!r} {message}")

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        value = self._get(key, default)
        if value not in choices:
            raise self._fail(key, f"is {value!r}; expected one of {', '.join(choices)}")
        return str(value)

    def text(self, key: str, default: str) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self._fail(key, f"must be a string, not {value!r}")
        return value

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self._fail(key, f"is {value!r}; expected an integer in {low}..{high}")
        return value

    def number(self, key: str, default: float, low: float, high: float) -> float:
        value = self._get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            raise self._fail(key, f"is {value!r}; expected a number in [{low}, {high}]")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._fail(key, f"is {value!r}; expected true or false")
        return value

    def texts(self, key: str, default: Sequence[str]) -> tuple[str, ...]:
        value = self._get(key, list(default))
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise self._fail(key, f"is {value!r}; expected a list of strings")
        return tuple(value)

    def optional_number(self, key: str, low: float, high: float) -> float | None:
        if self._values.get(key) is None:
            self._read.add(key)
            return None
        return self.number(key, 0.0, low, high)

    def done(self) -> None:
        unknown = sorted(set(self._values) - self._read)
        if unknown:
            known = ", ".join(sorted(self._read)) or "none"
            raise DomainError(self.domain, f"unknown parameters {unknown} (known: {known})")
