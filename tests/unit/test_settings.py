"""Settings from the environment: every field type, the shared ``TEMPER_`` fallback, bad values."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import pytest

from services.runtime.settings import (
    FLAT,
    NOT_FROM_ENV,
    DuplicateVariable,
    RuntimeSettings,
    SettingsError,
    from_env,
    variables,
)

PREFIX = "TEMPER_DEMO_"


@dataclass(frozen=True, kw_only=True)
class DemoSettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    count: int = 1
    ratio: float = 0.5
    enabled: bool = False
    label: str = "x"
    root: Path = Path("run")
    limit: int | None = 10
    legacy: Optional[float] = None  # noqa: UP045 - the typing.Optional spelling must work too
    names: tuple[str, ...] = ()
    ports: tuple[int, ...] = (1,)
    mode: Literal["fast", "safe"] = "fast"


def build(**environ: str) -> DemoSettings:
    return from_env(DemoSettings, PREFIX, environ)


def test_no_variables_keeps_every_default() -> None:
    assert build() == DemoSettings()
    assert build(UNRELATED="1", TEMPER_DEMOX_COUNT="5") == DemoSettings()


def test_every_field_type_is_parsed() -> None:
    settings = build(
        TEMPER_DEMO_COUNT="7",
        TEMPER_DEMO_RATIO="2.5",
        TEMPER_DEMO_ENABLED="yes",
        TEMPER_DEMO_LABEL="hello world",
        TEMPER_DEMO_ROOT="/tmp/state",
        TEMPER_DEMO_LIMIT="3",
        TEMPER_DEMO_LEGACY="1.25",
        TEMPER_DEMO_NAMES="a, b,,c ",
        TEMPER_DEMO_PORTS="8080,9090",
    )
    assert settings.count == 7
    assert settings.ratio == 2.5
    assert settings.enabled is True
    assert settings.label == "hello world"
    assert settings.root == Path("/tmp/state")
    assert isinstance(settings.root, Path)
    assert settings.limit == 3
    assert settings.legacy == 1.25
    assert settings.names == ("a", "b", "c")
    assert settings.ports == (8080, 9090)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("true", True),
        ("ON", True),
        (" Yes ", True),
        ("0", False),
        ("false", False),
        ("off", False),
        ("NO", False),
    ],
)
def test_booleans(raw: str, expected: bool) -> None:
    assert build(TEMPER_DEMO_ENABLED=raw).enabled is expected


@pytest.mark.parametrize("raw", ["", "none", "None", "null"])
def test_optional_fields_accept_none(raw: str) -> None:
    settings = build(TEMPER_DEMO_LIMIT=raw, TEMPER_DEMO_LEGACY=raw)
    assert settings.limit is None
    assert settings.legacy is None


def test_empty_tuple() -> None:
    assert build(TEMPER_DEMO_PORTS="").ports == ()


def test_nested_runtime_reads_its_own_prefix() -> None:
    settings = build(
        TEMPER_DEMO_RUNTIME_NATS_URL="nats://demo:1",
        TEMPER_DEMO_RUNTIME_HEARTBEAT_S="0.25",
        TEMPER_DEMO_RUNTIME_METRICS_PORT="0",
    )
    assert settings.runtime.nats_url == "nats://demo:1"
    assert settings.runtime.heartbeat_s == 0.25
    assert settings.runtime.metrics_port == 0
    assert settings.runtime.grace_s == RuntimeSettings().grace_s


def test_nested_runtime_falls_back_to_shared_variables() -> None:
    settings = build(TEMPER_NATS_URL="nats://shared:2", TEMPER_METRICS_PORT="none")
    assert settings.runtime.nats_url == "nats://shared:2"
    assert settings.runtime.metrics_port is None


def test_service_specific_beats_shared() -> None:
    settings = build(
        TEMPER_NATS_URL="nats://shared:2",
        TEMPER_DEMO_RUNTIME_NATS_URL="nats://mine:3",
        TEMPER_LOG_LEVEL="debug",
    )
    assert settings.runtime.nats_url == "nats://mine:3"
    assert settings.runtime.log_level == "debug"


def test_service_fields_do_not_read_shared_variables() -> None:
    # Only the runtime fields are shared (docs/operations.md): TEMPER_COUNT is no service's field.
    assert build(TEMPER_COUNT="9", TEMPER_LABEL="shared").count == 1
    assert build(TEMPER_COUNT="9", TEMPER_LABEL="shared").label == "x"


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"TEMPER_DEMO_COUNT": "seven"}, "TEMPER_DEMO_COUNT"),
        ({"TEMPER_DEMO_COUNT": "1.5"}, "TEMPER_DEMO_COUNT"),
        ({"TEMPER_DEMO_RATIO": "fast"}, "TEMPER_DEMO_RATIO"),
        ({"TEMPER_DEMO_ENABLED": "maybe"}, "TEMPER_DEMO_ENABLED"),
        ({"TEMPER_DEMO_LIMIT": "lots"}, "TEMPER_DEMO_LIMIT"),
        ({"TEMPER_DEMO_PORTS": "80,http"}, "TEMPER_DEMO_PORTS"),
        ({"TEMPER_DEMO_RUNTIME_GRACE_S": "soon"}, "TEMPER_DEMO_RUNTIME_GRACE_S"),
        # A bad shared value is reported under the variable that holds it.
        ({"TEMPER_HEARTBEAT_S": "often"}, "TEMPER_HEARTBEAT_S"),
    ],
)
def test_bad_values_name_the_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError) as caught:
        from_env(DemoSettings, PREFIX, environ)
    message = str(caught.value)
    assert message.startswith(f"{variable}=")
    bad = next(iter(environ.values())).split(",")[-1]  # a tuple names its bad item
    assert repr(bad) in message


def test_bad_boolean_says_what_is_accepted() -> None:
    with pytest.raises(SettingsError, match="expected a boolean"):
        build(TEMPER_DEMO_ENABLED="2")


def test_unsupported_field_type_is_a_settings_error() -> None:
    @dataclass(frozen=True)
    class Odd:
        when: complex = 0j

    assert from_env(Odd, "TEMPER_ODD_", {}) == Odd()
    with pytest.raises(SettingsError, match="TEMPER_ODD_WHEN"):
        from_env(Odd, "TEMPER_ODD_", {"TEMPER_ODD_WHEN": "1j"})


def test_settings_error_is_a_value_error() -> None:
    assert issubclass(SettingsError, ValueError)


def test_runtime_instance_id_defaults_to_host_and_pid() -> None:
    import os

    assert RuntimeSettings(instance="me").instance_id() == "me"
    assert RuntimeSettings().instance_id().endswith(f"-{os.getpid()}")


def test_a_nested_field_keeps_its_own_default_and_takes_single_overrides() -> None:
    """``maxima`` of the sandbox is not ``Limits()``: built from the environment, it must
    stay the field's default, with only the variables set changing it."""
    from services.sandbox.settings import Limits, SandboxSettings

    built = from_env(SandboxSettings, "TEMPER_SANDBOX_", {})
    assert built.maxima == SandboxSettings().maxima
    assert built.maxima != Limits()
    changed = from_env(SandboxSettings, "TEMPER_SANDBOX_", {"TEMPER_SANDBOX_MAXIMA_PIDS": "300"})
    assert changed.maxima.pids == 300
    assert changed.maxima.timeout_s == SandboxSettings().maxima.timeout_s
    assert changed.defaults == Limits()


def test_a_mode_switch_takes_only_its_values() -> None:
    assert build(TEMPER_DEMO_MODE="safe").mode == "safe"
    with pytest.raises(SettingsError, match="TEMPER_DEMO_MODE='Safe': not one of 'fast', 'safe'"):
        build(TEMPER_DEMO_MODE="Safe")


# ---------------------------------------------------------------- flat groups


@dataclass(frozen=True, kw_only=True)
class Inner:
    depth: int = 1


@dataclass(frozen=True, kw_only=True)
class Optimizer:
    lr: float = 0.1
    #: A flat group inside a flat group: ``inner.depth`` still reads ``<PREFIX>DEPTH``.
    inner: Inner = field(default_factory=Inner, metadata=FLAT)
    #: Built by the service from other settings, never from a variable.
    table: dict[str, int] = field(default_factory=dict, metadata=NOT_FROM_ENV)


@dataclass(frozen=True, kw_only=True)
class Grouped:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    name: str = "g"
    optimizer: Optimizer = field(
        default_factory=lambda: Optimizer(lr=0.5, inner=Inner(depth=9)), metadata=FLAT
    )


def test_a_flat_group_reads_the_parents_variables_recursively() -> None:
    built = from_env(Grouped, "TEMPER_G_", {"TEMPER_G_LR": "0.25", "TEMPER_G_DEPTH": "4"})
    assert built.optimizer.lr == 0.25
    assert built.optimizer.inner.depth == 4
    assert variables(Grouped, "TEMPER_G_")["TEMPER_G_DEPTH"] == "optimizer.inner.depth"
    # The group's name is no part of a variable.
    assert from_env(Grouped, "TEMPER_G_", {"TEMPER_G_OPTIMIZER_LR": "0.25"}) == Grouped()
    assert "TEMPER_G_OPTIMIZER_LR" not in variables(Grouped, "TEMPER_G_")


def test_a_flat_group_keeps_its_own_default_and_takes_single_overrides() -> None:
    built = from_env(Grouped, "TEMPER_G_", {"TEMPER_G_LR": "0.75"})
    assert built.optimizer == Optimizer(lr=0.75, inner=Inner(depth=9))


def test_a_top_level_flat_group_has_no_shared_fallback() -> None:
    assert from_env(Grouped, "TEMPER_G_", {"TEMPER_LR": "0.75", "TEMPER_DEPTH": "3"}) == Grouped()


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    connect_s: float = 1.0


@dataclass(frozen=True, kw_only=True)
class GroupedRuntime(RuntimeSettings):
    timeouts: Timeouts = field(default_factory=Timeouts, metadata=FLAT)


@dataclass(frozen=True, kw_only=True)
class WithGroupedRuntime:
    runtime: GroupedRuntime = field(default_factory=GroupedRuntime)


def test_a_flat_group_falls_back_as_its_parent_does() -> None:
    read = variables(WithGroupedRuntime, "TEMPER_W_")
    assert (
        read["TEMPER_W_RUNTIME_CONNECT_S"]
        == read["TEMPER_CONNECT_S"]
        == "runtime.timeouts.connect_s"
    )
    built = from_env(WithGroupedRuntime, "TEMPER_W_", {"TEMPER_CONNECT_S": "2.5"})
    assert built.runtime.timeouts.connect_s == 2.5
    mine = {"TEMPER_CONNECT_S": "2.5", "TEMPER_W_RUNTIME_CONNECT_S": "7"}
    assert from_env(WithGroupedRuntime, "TEMPER_W_", mine).runtime.timeouts.connect_s == 7.0


def test_only_the_runtime_group_falls_back_to_shared_variables() -> None:
    """Another nested group reading ``TEMPER_<FIELD>`` would let one variable set the
    sandbox's ``defaults`` and ``maxima`` alike."""
    from services.sandbox.settings import SandboxSettings

    read = variables(SandboxSettings, "TEMPER_SANDBOX_")
    assert read["TEMPER_SANDBOX_MAXIMA_PIDS"] == "maxima.pids"
    assert "TEMPER_PIDS" not in read
    assert from_env(SandboxSettings, "TEMPER_SANDBOX_", {"TEMPER_PIDS": "7"}) == SandboxSettings()


def test_a_field_kept_from_the_environment_is_never_read() -> None:
    built = from_env(Grouped, "TEMPER_G_", {"TEMPER_G_TABLE": "not a table"})
    assert built.optimizer.table == {}
    assert "table" not in " ".join(variables(Grouped, "TEMPER_G_").values())


def test_variables_lists_every_variable_with_its_field() -> None:
    read = variables(Grouped, "TEMPER_G_")
    own = {k: v for k, v in read.items() if not v.startswith("runtime.")}
    assert own == {
        "TEMPER_G_NAME": "name",
        "TEMPER_G_LR": "optimizer.lr",
        "TEMPER_G_DEPTH": "optimizer.inner.depth",
    }
    assert read["TEMPER_G_RUNTIME_NATS_URL"] == read["TEMPER_NATS_URL"] == "runtime.nats_url"


@dataclass(frozen=True, kw_only=True)
class Clashing:
    lr: float = 1.0
    optimizer: Optimizer = field(default_factory=Optimizer, metadata=FLAT)


@dataclass(frozen=True, kw_only=True)
class TwoGroupsClash:
    first: Inner = field(default_factory=Inner, metadata=FLAT)
    second: Inner = field(default_factory=Inner, metadata=FLAT)


@pytest.mark.parametrize(
    ("cls", "first", "second", "variable"),
    [
        (Clashing, "'lr'", "'optimizer.lr'", "TEMPER_C_LR"),
        (TwoGroupsClash, "'first.depth'", "'second.depth'", "TEMPER_C_DEPTH"),
    ],
)
def test_two_fields_on_one_variable_fail_at_build_naming_both(
    cls: type[Any], first: str, second: str, variable: str
) -> None:
    with pytest.raises(DuplicateVariable) as caught:
        from_env(cls, "TEMPER_C_", {})  # raised whether or not the variable is set
    message = str(caught.value)
    assert first in message and second in message and variable in message
    with pytest.raises(DuplicateVariable):
        variables(cls, "TEMPER_C_")


def test_a_top_level_field_named_like_a_shared_runtime_variable_clashes() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Shared:
        runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
        nats_url: str = ""

    with pytest.raises(DuplicateVariable, match="TEMPER_NATS_URL"):
        from_env(Shared, "TEMPER_", {})


def test_a_flat_group_must_be_a_dataclass() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Wrong:
        limit: int = field(default=1, metadata=FLAT)

    with pytest.raises(TypeError, match=r"Wrong\.limit: a flat group must be a dataclass"):
        from_env(Wrong, "TEMPER_W_", {})


@dataclass(frozen=True, kw_only=True)
class Checked:
    low: int = 0
    high: int = 1

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low must not exceed high, not {self.low} > {self.high}")


@dataclass(frozen=True, kw_only=True)
class Holder:
    span: Checked = field(default_factory=Checked, metadata=FLAT)


def test_a_check_of_a_group_is_a_settings_error_under_its_prefix() -> None:
    with pytest.raises(SettingsError, match=r"TEMPER_H_\*: low must not exceed high, not 5 > 1"):
        from_env(Holder, "TEMPER_H_", {"TEMPER_H_LOW": "5"})
