"""docker-compose.yml stays in step with the code: every built-in service is in it, its
command parses, and every setting it passes names a real settings field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from services import registry
from services.cli import build_parser
from services.runtime.settings import from_env, variables

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]


def _env(spec: dict[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in (spec.get("environment") or {}).items()}


@pytest.mark.parametrize("name", sorted(registry.BUILTIN))
def test_every_builtin_service_runs_with_temper_serve(name: str) -> None:
    spec = SERVICES[name]
    assert spec["command"] == ["serve", name]
    args = build_parser().parse_args(spec["command"])
    assert args.name == name
    assert _env(spec)["TEMPER_NATS_URL"] == "nats://nats:4222"


#: Services compose runs only when asked (a profile), with their settings checked too.
ON_PROFILE = {"gateway": "gateway"}


@pytest.mark.parametrize("name", sorted({*registry.BUILTIN, *ON_PROFILE}))
def test_settings_passed_by_compose_are_real_fields(name: str) -> None:
    env = _env(SERVICES[name])
    settings_cls = registry.settings_type(registry.lookup(name).load())
    prefix = f"TEMPER_{name.upper()}_"
    read = variables(settings_cls, prefix)
    for key in env:
        if key.startswith(prefix):
            assert key in read, key
    settings = from_env(settings_cls, prefix, env)
    assert settings.runtime.nats_url == "nats://nats:4222"


@pytest.mark.parametrize(("name", "profile"), sorted(ON_PROFILE.items()))
def test_a_service_on_request_runs_only_with_its_profile(name: str, profile: str) -> None:
    spec = SERVICES[name]
    assert spec["profiles"] == [profile] and spec["command"] == ["serve", name]
    assert all("profiles" not in SERVICES[n] for n in registry.BUILTIN)
    host = yaml.safe_load((ROOT / "deploy" / "compose" / "host.yml").read_text())
    assert host["services"][name]["network_mode"] == "host"


def test_build_context_has_what_the_dockerfile_copies() -> None:
    dockerfile = ROOT / SERVICES["nats"]["build"]["dockerfile"]
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source


def test_no_network_is_declared() -> None:
    # Sandboxes run with --network none; the stack itself uses compose's default network only.
    assert "networks" not in COMPOSE
    assert all("network_mode" not in spec for spec in SERVICES.values())
