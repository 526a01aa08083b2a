"""The range a validator's score may take, and the range of a domain's reward.

Every validator kind declares its range: the validator service clamps (and flags) a
score outside it, and the learner refuses a reward outside its domain's range, so a
validator bug or a candidate that takes over a harness can never hand the learner an
advantage out of scale.  Built-in kinds score in [0, 1], but for a reward model's raw
logit and a length penalty's [-1, 0]; any kind, a plugin's included, may declare its
own with the spec parameter ``score_range = [low, high]``.  A domain's range follows
from its validators' ranges and weights (the reward is their weighted sum).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from services.domains.api import Domain, DomainError, ValidatorSpec

#: The spec parameter that declares a validator's range (taken out before its factory).
SCORE_RANGE: Final = "score_range"


@dataclass(frozen=True, slots=True)
class ScoreRange:
    low: float
    high: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high):
            raise ValueError(f"a score range is two finite numbers, low <= high: {self}")

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def clamp(self, value: float) -> float:
        return min(max(value, self.low), self.high)

    def weighted(self, weight: float) -> ScoreRange:
        ends = (weight * self.low, weight * self.high)
        return ScoreRange(min(ends), max(ends))

    def __str__(self) -> str:
        return f"[{self.low:g}, {self.high:g}]"


UNIT: Final = ScoreRange(0.0, 1.0)
#: A reward model's raw logit, unless its spec declares otherwise.
RAW_LOGIT: Final = ScoreRange(-10.0, 10.0)
#: Built-in kinds whose range is not [0, 1]: a length penalty takes up to the whole reward.
KIND_RANGES: Final[Mapping[str, ScoreRange]] = {"length": ScoreRange(-1.0, 0.0)}


def declared(spec: ValidatorSpec, domain: str = "") -> ScoreRange:
    """The range ``spec``'s scores must stay in."""
    own = spec.params.get(SCORE_RANGE)
    if own is not None:
        return _parse(own, spec, domain)
    if spec.kind == "reward_model" and spec.params.get("transform") == "raw":
        return RAW_LOGIT
    return KIND_RANGES.get(spec.kind, UNIT)


def _parse(value: Any, spec: ValidatorSpec, domain: str) -> ScoreRange:
    numbers = isinstance(value, list | tuple) and len(value) == 2
    if numbers and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        try:
            return ScoreRange(float(value[0]), float(value[1]))
        except ValueError:
            pass
    raise DomainError(
        domain or spec.label,
        f"validator {spec.label!r}: {SCORE_RANGE} must be [low, high] finite numbers, "
        f"low <= high, not {value!r}",
    )


def total(ranges: Iterable[tuple[ScoreRange, float]]) -> ScoreRange:
    """The range of a weighted sum of scores, each in its range."""
    low = high = 0.0
    for score_range, weight in ranges:
        part = score_range.weighted(weight)
        low, high = low + part.low, high + part.high
    return ScoreRange(low, high)


def of_domain(domain: Domain) -> ScoreRange:
    """The range of ``domain``'s reward."""
    return total((declared(spec, domain.name), spec.weight) for spec in domain.validators)


def of_domains(domains: Iterable[Domain]) -> Mapping[str, ScoreRange]:
    return {domain.name: of_domain(domain) for domain in domains}
