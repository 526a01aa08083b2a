"""The validator service: rewards for rollouts across every registered domain.

Its names load on first use: ``services.validator.settings`` is read by every ``temper``
command that checks a stack's settings, and must not pull in every judge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.runtime.lazy import exports

if TYPE_CHECKING:
    from services.validator.service import ValidatorService
    from services.validator.settings import ValidatorSettings

__all__ = ["ValidatorService", "ValidatorSettings"]

__getattr__ = exports(
    __name__,
    {
        "ValidatorService": "services.validator.service",
        "ValidatorSettings": "services.validator.settings",
    },
)
