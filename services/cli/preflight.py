"""Checks `temper up` makes before it starts anything: settings that would fail every
request later stop the stack now, with the name of what to change."""

from __future__ import annotations

from collections.abc import Mapping

from services.cli.common import CliError
from services.domains import load_registry
from services.runtime.settings import SettingsError, from_env
from services.sandbox.settings import SandboxSettings
from services.validator.settings import ValidatorSettings


def domain_limits(environ: Mapping[str, str]) -> list[str]:
    """Each domain whose own sandbox limits the sandbox service would refuse, one line each."""
    sandbox = from_env(SandboxSettings, "TEMPER_SANDBOX_", environ)
    validator = from_env(ValidatorSettings, "TEMPER_VALIDATOR_", environ)
    registry = load_registry(validator.domains_config, plugins=validator.domain_plugins)
    wrong = []
    for domain in registry:
        if domain.sandbox is not None:
            wrong += [
                f"domain {domain.name!r}: {why}" for why in sandbox.over_maxima(domain.sandbox)
            ]
    return wrong


def check_stack(names: tuple[str, ...], environ: Mapping[str, str]) -> None:
    """Stop with a CliError when the sandbox could not start, or would refuse a domain's
    every request, under these settings."""
    if "sandbox" not in names:
        return
    try:
        from_env(SandboxSettings, "TEMPER_SANDBOX_", environ).check()
        wrong = domain_limits(environ) if "validator" in names else []
    except SettingsError as error:
        raise CliError(str(error), 2) from None
    if wrong:
        raise CliError("the sandbox would refuse these domains' limits: " + "; ".join(wrong), 2)
