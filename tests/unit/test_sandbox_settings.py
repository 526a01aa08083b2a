"""Per-language sandbox limits: the language's defaults, within the operator's maxima."""

from __future__ import annotations

import pytest

from protocol.messages import SandboxLimits
from services.runtime.errors import RequestRejected
from services.runtime.settings import SettingsError
from services.sandbox.limits import resolve
from services.sandbox.settings import Limits, SandboxSettings


def test_a_language_lays_its_own_defaults_over_the_services() -> None:
    settings = SandboxSettings()
    assert settings.defaults_for("python") == settings.defaults
    cpp = settings.defaults_for("cpp")
    assert (cpp.memory_mb, cpp.pids) == (2048, 256)
    assert cpp.timeout_s == settings.defaults.timeout_s  # what the entry leaves out
    assert settings.defaults_for("openscad").timeout_s == 60.0
    assert set(settings.language_defaults) <= set(settings.languages)


def test_language_defaults_are_clamped_to_the_maxima() -> None:
    settings = SandboxSettings(maxima=Limits(memory_mb=1500, pids=200, timeout_s=30.0))
    cpp = settings.defaults_for("cpp")
    assert (cpp.memory_mb, cpp.pids) == (1500, 200)
    assert settings.defaults_for("openscad").timeout_s == 30.0


def test_a_request_overrides_the_language_but_not_the_maxima() -> None:
    settings = SandboxSettings()
    defaults = settings.defaults_for("cpp")
    asked = resolve(SandboxLimits(memory_mb=700), defaults, settings.maxima)
    assert (asked.memory_mb, asked.pids) == (700, 256)
    with pytest.raises(RequestRejected, match="pids 2000 is above this service's maximum 1024"):
        resolve(SandboxLimits(pids=2000), defaults, settings.maxima)


def test_the_default_settings_pass_their_start_check() -> None:
    SandboxSettings().check()


def test_a_maximum_below_a_language_default_stops_the_start_naming_both() -> None:
    settings = SandboxSettings(maxima=Limits(memory_mb=1500, pids=200, timeout_s=30.0))
    with pytest.raises(SettingsError) as caught:
        settings.check()
    message = str(caught.value)
    assert "language 'openscad': timeout_s 60 is above the maximum 30" in message
    assert "TEMPER_SANDBOX_MAXIMA_MEMORY_MB" in message


def test_a_default_above_its_maximum_stops_the_start() -> None:
    settings = SandboxSettings(defaults=Limits(timeout_s=200.0))
    with pytest.raises(SettingsError, match="defaults: timeout_s 200 is above the maximum 120"):
        settings.check()


def test_over_maxima_names_each_field_a_domain_asks_too_much_of() -> None:
    settings = SandboxSettings()
    assert settings.over_maxima(SandboxLimits(timeout_s=60.0, memory_mb=2048)) == []
    over = settings.over_maxima(SandboxLimits(timeout_s=600.0, pids=5000))
    assert [line.split()[0] for line in over] == ["timeout_s", "pids"]


def test_a_checker_user_that_is_the_codes_user_stops_the_start() -> None:
    settings = SandboxSettings(user="10001", checker_user="10001")
    with pytest.raises(SettingsError, match="checker_user '10001' is the code's user"):
        settings.check()
