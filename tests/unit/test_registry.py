"""The service registry: built-in entries, entry-point plugins, building a service from the env."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import EntryPoint

import pytest

from services import registry
from services.control import ControlService, ControlSettings
from services.runtime.service import Service
from services.runtime.settings import RuntimeSettings, SettingsError


@dataclass(frozen=True, kw_only=True)
class EchoSettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    greeting: str = "hi"


class EchoService(Service):
    name = "echo"

    def __init__(self, settings: EchoSettings) -> None:
        super().__init__(settings.runtime)
        self.settings = settings


class NotAService:
    def __init__(self, settings: EchoSettings) -> None:
        self.settings = settings


def plugins(monkeypatch: pytest.MonkeyPatch, **targets: str) -> None:
    """Pretend installed packages declare these ``temper.services`` entry points."""
    points = [
        EntryPoint(name=name, value=value, group=registry.ENTRY_POINT_GROUP)
        for name, value in targets.items()
    ]

    def entry_points(*, group: str) -> list[EntryPoint]:
        return points if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(registry, "entry_points", entry_points)


def test_control_is_builtin() -> None:
    entry = registry.entries()["control"]
    assert entry.target == "services.control:ControlService"
    assert entry.load() is ControlService
    assert registry.lookup("control") == entry


def test_unknown_service_lists_the_known_ones() -> None:
    with pytest.raises(registry.UnknownService) as caught:
        registry.lookup("nosuch")
    assert caught.value.name == "nosuch"
    known = ", ".join(sorted(registry.entries()))
    assert str(caught.value) == f"unknown service 'nosuch'; known: {known}"
    assert "control" in known
    assert isinstance(caught.value, LookupError)


def test_build_unknown_service_raises() -> None:
    with pytest.raises(registry.UnknownService, match="nosuch"):
        registry.build("nosuch", {})


def test_settings_type_is_the_constructor_annotation() -> None:
    assert registry.settings_type(ControlService) is ControlSettings
    assert registry.settings_type(EchoService) is EchoSettings


def test_build_control_reads_its_settings_from_the_environment() -> None:
    service = registry.build(
        "control",
        {
            "TEMPER_CONTROL_STALE_AFTER_S": "3",
            "TEMPER_CONTROL_FORGET_AFTER_S": "9.5",
            "TEMPER_NATS_URL": "nats://shared:4222",
            "TEMPER_CONTROL_RUNTIME_HEARTBEAT_S": "0.5",
            "TEMPER_HEARTBEAT_S": "7",
            "TEMPER_INSTANCE": "ctl-1",
        },
    )
    assert isinstance(service, ControlService)
    assert service.settings.stale_after_s == 3.0
    assert service.settings.forget_after_s == 9.5
    assert service.runtime is service.settings.runtime
    assert service.runtime.nats_url == "nats://shared:4222"
    assert service.runtime.heartbeat_s == 0.5  # the service's own variable wins
    assert service.instance == "ctl-1"


def test_build_with_no_environment_uses_defaults() -> None:
    service = registry.build("control", {})
    assert isinstance(service, ControlService)
    assert service.settings == ControlSettings()


def test_build_bad_value_raises_settings_error() -> None:
    with pytest.raises(SettingsError, match="TEMPER_CONTROL_STALE_AFTER_S"):
        registry.build("control", {"TEMPER_CONTROL_STALE_AFTER_S": "soon"})


def test_entry_point_plugins_are_found_and_built(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins(monkeypatch, echo=f"{__name__}:EchoService")
    assert {"control", "echo"} <= set(registry.entries())
    service = registry.build(
        "echo", {"TEMPER_ECHO_GREETING": "hello", "TEMPER_ECHO_RUNTIME_INSTANCE": "e1"}
    )
    assert isinstance(service, EchoService)
    assert service.settings.greeting == "hello"
    assert service.instance == "e1"


def test_a_plugin_cannot_replace_a_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins(monkeypatch, control=f"{__name__}:EchoService")
    assert registry.lookup("control").load() is ControlService


def test_a_plugin_that_is_not_a_service_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins(monkeypatch, bogus=f"{__name__}:NotAService")
    with pytest.raises(TypeError, match="not a Service subclass"):
        registry.build("bogus", {})


def test_the_feeder_starts_only_with_a_mix_and_its_port_follows_the_six() -> None:
    assert "feeder" in registry.entries()
    assert "feeder" not in registry.default_services({})
    with_mix = registry.default_services({"TEMPER_FEEDER_MIX": "arithmetic"})
    assert with_mix == (
        "control",
        "feeder",
        "generator",
        "learner",
        "replay",
        "sandbox",
        "validator",
    )
    ports = registry.metrics_ports(["feeder", *registry.PORT_ORDER])
    assert ports["feeder"] == 9466 and ports["validator"] == 9465 and ports["control"] == 9460
