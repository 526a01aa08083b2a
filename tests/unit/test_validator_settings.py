"""The validator is a built-in service; ``temper up`` builds it from the environment."""

from __future__ import annotations

from pathlib import Path

from services import registry
from services.validator import ValidatorService, ValidatorSettings


def test_validator_is_built_from_temper_validator_variables() -> None:
    service = registry.build(
        "validator",
        {
            "TEMPER_NATS_URL": "nats://127.0.0.1:4999",
            "TEMPER_VALIDATOR_DOMAINS_CONFIG": "deploy/domains",
            "TEMPER_VALIDATOR_MAX_IN_FLIGHT": "32",
            "TEMPER_VALIDATOR_REWARD_BATCH_WAIT_S": "0.05",
            "TEMPER_VALIDATOR_DOMAIN_PLUGINS": "no",
        },
    )
    assert isinstance(service, ValidatorService)
    settings = service.settings
    assert settings.runtime.nats_url == "nats://127.0.0.1:4999"
    assert settings.domains_config == Path("deploy/domains")
    assert (settings.max_in_flight, settings.reward_batch_wait_s) == (32, 0.05)
    assert settings.domain_plugins is False


def test_defaults_serve_the_builtin_domains() -> None:
    settings = ValidatorSettings()
    assert settings.domains_config is None
    assert settings.sandbox_subject == "temper.v1.sandbox.exec"
    assert registry.lookup("validator").load() is ValidatorService
