"""The validator service: rewards for rollouts across every registered domain."""

from services.validator.service import ValidatorService
from services.validator.settings import ValidatorSettings

__all__ = ["ValidatorService", "ValidatorSettings"]
