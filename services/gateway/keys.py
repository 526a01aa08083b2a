"""API keys: who is calling, in which tier, at what rate, with which session timeout.

Keys come from a TOML or JSON file and/or the same JSON in one setting
(``TEMPER_GATEWAY_KEYS``); docs/gateway.md gives the format.  Only SHA-256 digests of the
keys are kept, and logs name a key by a short prefix of its digest, so a key never
appears in a log line.  Each key has a token bucket: ``rate_per_s`` tokens a second up to
``burst``; a request takes one, and one that finds none is refused with the time until
the next (429 ``Retry-After``).
"""

from __future__ import annotations

import hashlib
import json
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from protocol.messages import Tier, Token
from services.gateway import errors
from services.gateway.settings import GatewaySettings
from services.runtime.settings import SettingsError

#: Shorter keys are refused: they could be guessed.
MIN_KEY_LENGTH = 16
#: Hex digits of a key's digest that name it in logs.
KEY_ID_LENGTH = 12
Sha256 = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}\Z")]
Secret = Annotated[str, Meta(min_length=MIN_KEY_LENGTH)]


class KeysError(SettingsError):
    """The keys could not be read: names the source and the entry."""


class KeyEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One key as written: the key itself or its SHA-256 (hex), and what it may do."""

    key: Secret | None = None
    sha256: Sha256 | None = None
    tenant: Token
    tier: Tier | None = None
    rate_per_s: Annotated[float, Meta(ge=0)] | None = None
    burst: Annotated[int, Meta(ge=1)] | None = None
    session_timeout_s: Annotated[float, Meta(gt=0)] | None = None


class KeysFile(msgspec.Struct, forbid_unknown_fields=True):
    keys: list[KeyEntry]


@dataclass(frozen=True, kw_only=True)
class KeyPolicy:
    """What a key may do; ``key_id`` names it in logs."""

    key_id: str
    tenant: str
    tier: int
    rate_per_s: float
    burst: int
    session_timeout_s: float


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(key: str) -> str:
    """How logs name a key: a prefix of its digest."""
    return digest(key)[:KEY_ID_LENGTH]


class TokenBucket:
    """``rate_per_s`` tokens a second, at most ``burst`` held; 0 rate: unlimited."""

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = float(burst)
        self.updated = now

    def take(self, now: float) -> float:
        """0 when a token was taken, else the seconds until one will be there."""
        if self.rate_per_s == 0:
            return 0.0
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(float(self.burst), self.tokens + elapsed * self.rate_per_s)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


class KeyRing:
    """The known keys (by digest) and their buckets."""

    def __init__(
        self, policies: Mapping[str, KeyPolicy], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._policies = dict(policies)
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    @classmethod
    def load(
        cls, settings: GatewaySettings, clock: Callable[[], float] = time.monotonic
    ) -> KeyRing:
        """The keys of ``settings.keys_file`` and ``settings.keys``; KeysError when they
        cannot be read or there are none."""
        entries: list[tuple[str, KeyEntry]] = []
        if settings.keys_file is not None:
            entries += _entries(_read_file(settings.keys_file), str(settings.keys_file))
        if settings.keys.strip():
            entries += _entries(
                _parse_json(settings.keys, "TEMPER_GATEWAY_KEYS"), "TEMPER_GATEWAY_KEYS"
            )
        if not entries:
            raise KeysError(
                "the gateway has no API keys: set TEMPER_GATEWAY_KEYS_FILE (TOML or JSON) "
                "or TEMPER_GATEWAY_KEYS (JSON), see docs/gateway.md"
            )
        return cls(_policies(entries, settings), clock)

    def __len__(self) -> int:
        return len(self._policies)

    def authenticate(self, authorization: str | None) -> KeyPolicy:
        """The policy of the key in an ``Authorization`` header; ApiError 401 otherwise."""
        return self.lookup(bearer(authorization))

    def lookup(self, key: str) -> KeyPolicy:
        """The policy of ``key``; ApiError 401 when it is not known."""
        policy = self._policies.get(digest(key))
        if policy is None:
            raise errors.invalid_key()
        return policy

    def admit(self, policy: KeyPolicy) -> None:
        """Take one request from the key's bucket; ApiError 429 when it is empty."""
        now = self._clock()
        bucket = self._buckets.get(policy.key_id)
        if bucket is None:
            bucket = self._buckets[policy.key_id] = TokenBucket(
                policy.rate_per_s, policy.burst, now
            )
        wait_s = bucket.take(now)
        if wait_s > 0:
            raise errors.rate_limited(wait_s)


def bearer(authorization: str | None) -> str:
    """The key of ``Authorization: Bearer <key>``; ApiError 401 when there is none."""
    if not authorization or not authorization.strip():
        raise errors.missing_key()
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise errors.invalid_key()
    return key


def _read_file(path: Path) -> Any:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise KeysError(f"keys file {path}: cannot be read: {error}") from None
    if path.suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise KeysError(f"keys file {path}: not valid TOML: {error}") from None
    if path.suffix == ".json":
        return _parse_json(text, f"keys file {path}")
    raise KeysError(f"keys file {path}: must end in .toml or .json")


def _parse_json(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise KeysError(f"{source}: not valid JSON: {error}") from None


def _entries(raw: Any, source: str) -> list[tuple[str, KeyEntry]]:
    try:
        parsed = msgspec.convert(raw, KeysFile)
    except msgspec.ValidationError as error:
        # The message names the entry (``$.keys[1].tier``), never the value of a key.
        raise KeysError(f"{source}: {error}") from None
    for index, entry in enumerate(parsed.keys):
        if (entry.key is None) == (entry.sha256 is None):
            raise KeysError(f"{source}: keys[{index}] needs exactly one of `key` and `sha256`")
    return [(f"{source} keys[{i}]", entry) for i, entry in enumerate(parsed.keys)]


def _policies(
    entries: list[tuple[str, KeyEntry]], settings: GatewaySettings
) -> dict[str, KeyPolicy]:
    policies: dict[str, KeyPolicy] = {}
    where: dict[str, str] = {}
    for place, entry in entries:
        hashed = entry.sha256 or digest(entry.key or "")
        if hashed in policies:
            raise KeysError(f"{place}: the same key as {where[hashed]}")
        where[hashed] = place
        policies[hashed] = KeyPolicy(
            key_id=hashed[:KEY_ID_LENGTH],
            tenant=entry.tenant,
            tier=settings.tier if entry.tier is None else entry.tier,
            rate_per_s=settings.rate_per_s if entry.rate_per_s is None else entry.rate_per_s,
            burst=settings.burst if entry.burst is None else entry.burst,
            session_timeout_s=entry.session_timeout_s or settings.session_timeout_s,
        )
    return policies
