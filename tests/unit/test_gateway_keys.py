"""The gateway's API keys: reading them, authenticating, and each key's token bucket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services import registry
from services.gateway.errors import ApiError
from services.gateway.keys import KeyRing, KeysError, TokenBucket, digest, key_id
from services.gateway.service import GatewayModelError, GatewayService
from services.gateway.settings import GatewaySettings

ALPHA = "sk-alpha-0123456789abcdef"
BETA = "sk-beta-0123456789abcdef"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ring(keys: list[dict[str, object]], clock: Clock | None = None, **settings: object) -> KeyRing:
    text = json.dumps({"keys": keys})
    return KeyRing.load(GatewaySettings(keys=text, **settings), clock or Clock())  # type: ignore[arg-type]


def refusal(call: object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()  # type: ignore[operator]
    return caught.value


def test_a_key_maps_to_its_tenant_tier_rate_and_timeout() -> None:
    keys = ring(
        [
            {"key": ALPHA, "tenant": "acme", "tier": 0, "rate_per_s": 2, "burst": 3},
            {"key": BETA, "tenant": "beta", "session_timeout_s": 30},
        ],
        tier=2,
        rate_per_s=5.0,
        burst=7,
        session_timeout_s=99.0,
    )
    alpha = keys.authenticate(f"Bearer {ALPHA}")
    assert (alpha.tenant, alpha.tier, alpha.rate_per_s, alpha.burst) == ("acme", 0, 2.0, 3)
    assert alpha.session_timeout_s == 99.0
    beta = keys.authenticate(f"bearer  {BETA} ")
    # A key that sets nothing takes the settings' defaults.
    assert (beta.tenant, beta.tier, beta.rate_per_s, beta.burst) == ("beta", 2, 5.0, 7)
    assert beta.session_timeout_s == 30.0
    assert alpha.key_id == key_id(ALPHA) and len(alpha.key_id) == 12
    assert ALPHA not in repr(alpha)


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "missing_api_key"),
        ("", "missing_api_key"),
        ("Basic dXNlcjpwdw==", "invalid_api_key"),
        ("Bearer", "invalid_api_key"),
        ("Bearer sk-unknown-0123456789abcdef", "invalid_api_key"),
        (f"Bearer {ALPHA}x", "invalid_api_key"),
    ],
)
def test_a_missing_or_bad_key_is_401(header: str | None, code: str) -> None:
    keys = ring([{"key": ALPHA, "tenant": "acme"}])
    error = refusal(lambda: keys.authenticate(header))
    assert (error.status, error.code, error.type) == (401, code, "authentication_error")
    assert error.headers == {"WWW-Authenticate": "Bearer"}
    assert ALPHA not in error.message


def test_a_file_may_hold_only_the_digest_of_a_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'[[keys]]\nsha256 = "{digest(ALPHA)}"\ntenant = "acme"\ntier = 3\n')
    keys = KeyRing.load(GatewaySettings(keys_file=path))
    assert keys.authenticate(f"Bearer {ALPHA}").tier == 3
    assert ALPHA not in path.read_text()


def test_file_and_environment_keys_are_merged(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [{"key": ALPHA, "tenant": "acme"}]}))
    inline = json.dumps({"keys": [{"key": BETA, "tenant": "beta"}]})
    keys = KeyRing.load(GatewaySettings(keys_file=path, keys=inline))
    assert len(keys) == 2
    assert keys.authenticate(f"Bearer {BETA}").tenant == "beta"


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        ([{"key": "short", "tenant": "acme"}], "$.keys[0].key"),
        ([{"key": ALPHA, "tenant": "not a token"}], "$.keys[0].tenant"),
        ([{"key": ALPHA, "tenant": "acme", "tier": 9}], "$.keys[0].tier"),
        ([{"key": ALPHA, "tenant": "acme", "rate_per_s": -1}], "$.keys[0].rate_per_s"),
        ([{"key": ALPHA, "tenant": "acme", "colour": "red"}], "unknown field `colour`"),
        ([{"tenant": "acme"}], "exactly one of `key` and `sha256`"),
        ([{"key": ALPHA, "sha256": digest(ALPHA), "tenant": "a"}], "exactly one"),
        ([{"key": ALPHA, "tenant": "a"}, {"key": ALPHA, "tenant": "b"}], "the same key as"),
        ([{"key": ALPHA, "tenant": "a"}, {"sha256": digest(ALPHA), "tenant": "b"}], "same key"),
    ],
)
def test_a_bad_entry_is_refused_by_name(entries: list[dict[str, object]], named: str) -> None:
    with pytest.raises(KeysError, match="TEMPER_GATEWAY_KEYS") as caught:
        ring(entries)
    assert named in str(caught.value)
    assert ALPHA not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("keys.toml", "[[keys]\n", "not valid TOML"),
        ("keys.json", "{", "not valid JSON"),
        ("keys.yaml", "keys: []", "must end in .toml or .json"),
        ("missing.json", None, "cannot be read"),
    ],
)
def test_an_unreadable_file_is_named(
    tmp_path: Path, name: str, text: str | None, problem: str
) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(KeysError, match=problem) as caught:
        KeyRing.load(GatewaySettings(keys_file=path))
    assert str(path) in str(caught.value)


def test_no_keys_at_all_is_a_settings_error() -> None:
    with pytest.raises(KeysError, match="no API keys"):
        KeyRing.load(GatewaySettings())


def test_over_the_rate_is_429_with_retry_after_rounded_up() -> None:
    clock = Clock()
    keys = ring([{"key": ALPHA, "tenant": "a", "rate_per_s": 0.4, "burst": 2}], clock)
    policy = keys.authenticate(f"Bearer {ALPHA}")
    keys.admit(policy)
    keys.admit(policy)
    error = refusal(lambda: keys.admit(policy))
    # Empty bucket at 0.4 tokens/s: one token in 2.5 s, announced as 3.
    assert (error.status, error.code, error.headers) == (
        429,
        "rate_limit_exceeded",
        {"Retry-After": "3"},
    )
    clock.now += 2.4
    assert refusal(lambda: keys.admit(policy)).headers["Retry-After"] == "1"
    clock.now += 0.2
    keys.admit(policy)


def test_each_key_has_its_own_bucket() -> None:
    keys = ring(
        [{"key": ALPHA, "tenant": "a", "rate_per_s": 1, "burst": 1}, {"key": BETA, "tenant": "b"}]
    )
    alpha, beta = keys.authenticate(f"Bearer {ALPHA}"), keys.authenticate(f"Bearer {BETA}")
    keys.admit(alpha)
    assert refusal(lambda: keys.admit(alpha)).status == 429
    keys.admit(beta)


def test_a_bucket_refills_to_its_burst_only() -> None:
    bucket = TokenBucket(rate_per_s=10.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.1)
    # A long idle time refills to the burst, not beyond.
    assert [bucket.take(1000.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(1000.0) > 0


def test_a_zero_rate_is_unlimited() -> None:
    bucket = TokenBucket(rate_per_s=0.0, burst=1, now=0.0)
    assert all(bucket.take(0.0) == 0.0 for _ in range(1000))


def test_temper_serve_gateway_builds_it_from_the_environment(
    tmp_path: Path, tiny_model: Path
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'[[keys]]\nkey = "{ALPHA}"\ntenant = "acme"\n')
    env = {
        "TEMPER_GATEWAY_MODEL": str(tiny_model),
        "TEMPER_GATEWAY_KEYS_FILE": str(path),
        "TEMPER_GATEWAY_KEYS": json.dumps({"keys": [{"key": BETA, "tenant": "beta"}]}),
        "TEMPER_GATEWAY_PORT": "0",
        "TEMPER_GATEWAY_RATE_PER_S": "2.5",
    }
    service = registry.build("gateway", env)
    assert isinstance(service, GatewayService)
    assert (service.settings.port, service.settings.rate_per_s) == (0, 2.5)
    assert service.keys.authenticate(f"Bearer {BETA}").rate_per_s == 2.5
    assert BETA not in repr(service.settings)
    with pytest.raises(KeysError, match="no API keys"):
        registry.build("gateway", {})
    with pytest.raises(GatewayModelError, match="TEMPER_GATEWAY_MODEL"):
        registry.build("gateway", {k: v for k, v in env.items() if k != "TEMPER_GATEWAY_MODEL"})


def test_temper_up_starts_it_only_when_its_keys_file_is_set() -> None:
    assert "gateway" not in registry.default_services({})
    assert "gateway" in registry.default_services({"TEMPER_GATEWAY_KEYS_FILE": "keys.toml"})
    # Its /metrics port comes after every other, so none of theirs moved.
    ports = registry.metrics_ports(["gateway", "feeder", *registry.PORT_ORDER])
    assert (ports["feeder"], ports["gateway"]) == (9466, 9467)
