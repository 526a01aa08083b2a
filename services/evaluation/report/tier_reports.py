"""Tiered evaluation reports (``eval/tiers/v<version>.json``, schema 1) as typed records.

Only the figures the run report shows are kept.  Optional parts of the schema (a chain
tier for single-turn domains, tool-format and code-pass figures) become ``None``; a
report missing a required part raises ``KeyError`` or ``TypeError`` for the reader to
skip it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.evaluation.previews import Preview, parse_previews

SCHEMA = 1


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float
    n: int


@dataclass(frozen=True)
class UnitTier:
    greedy: Interval
    pass_at_1: Interval
    pass_at_k: Interval
    k: int
    tool_format: Interval | None
    code_pass: Interval | None


@dataclass(frozen=True)
class ChainTier:
    completion_rate: Interval
    success_rate: Interval
    turns_mean: float
    attempts_mean: float
    recovery_rate: Interval | None
    tool_error_rate: Interval | None


@dataclass(frozen=True)
class SystemTier:
    success_rate: Interval
    infra_failure_rate: Interval
    invalid_rate: Interval
    latency_s: Mapping[str, float]
    cost_per_task: Mapping[str, float]


@dataclass(frozen=True)
class DomainTiers:
    name: str
    family: str
    problems: int
    rollouts: int
    unit: UnitTier
    chain: ChainTier | None
    system: SystemTier
    validators: Mapping[str, float]
    completion_tokens_mean: float | None
    #: Pictures of the best and worst answers (CAD renders); empty for other domains.
    previews: tuple[Preview, ...] = ()


@dataclass(frozen=True)
class TierReport:
    policy: str
    version: int | None
    samples: int
    domains: Mapping[str, DomainTiers]
    macro: Mapping[str, float]

    @property
    def label(self) -> str:
        if self.version is None:
            return self.policy or "unversioned"
        return f"v{self.version}"


def parse_tier_report(raw: dict[str, Any]) -> TierReport:
    if raw.get("schema") != SCHEMA:
        raise ValueError(f"tier report schema {raw.get('schema')!r}, expected {SCHEMA}")
    version = raw.get("version")
    overall = raw.get("overall") or {}
    return TierReport(
        policy=str(raw.get("policy", "")),
        version=None if version is None else int(version),
        samples=int(raw.get("samples", 0)),
        domains={str(name): _domain(str(name), d) for name, d in raw["domains"].items()},
        macro=_numbers(overall.get("macro") or {}),
    )


def _domain(name: str, raw: dict[str, Any]) -> DomainTiers:
    tokens = raw.get("completion_tokens_mean")
    return DomainTiers(
        name=name,
        family=str(raw.get("family", "")),
        problems=int(raw.get("problems", 0)),
        rollouts=int(raw.get("rollouts", 0)),
        unit=_unit(raw["unit"]),
        chain=None if raw.get("chain") is None else _chain(raw["chain"]),
        system=_system(raw["system"]),
        validators=_numbers(raw.get("validators") or {}),
        completion_tokens_mean=None if tokens is None else float(tokens),
        previews=parse_previews(raw.get("previews")),
    )


def _unit(raw: dict[str, Any]) -> UnitTier:
    return UnitTier(
        greedy=_interval(raw["greedy"]),
        pass_at_1=_interval(raw["pass_at_1"]),
        pass_at_k=_interval(raw["pass_at_k"]),
        k=int(raw.get("k", 0)),
        tool_format=_optional(raw.get("tool_format")),
        code_pass=_optional(raw.get("code_pass")),
    )


def _chain(raw: dict[str, Any]) -> ChainTier:
    return ChainTier(
        completion_rate=_interval(raw["completion_rate"]),
        success_rate=_interval(raw["success_rate"]),
        turns_mean=float((raw.get("turns") or {}).get("mean", 0.0)),
        attempts_mean=float((raw.get("attempts") or {}).get("mean", 0.0)),
        recovery_rate=_optional(raw.get("recovery_rate")),
        tool_error_rate=_optional(raw.get("tool_error_rate")),
    )


def _system(raw: dict[str, Any]) -> SystemTier:
    return SystemTier(
        success_rate=_interval(raw["success_rate"]),
        infra_failure_rate=_interval(raw["infra_failure_rate"]),
        invalid_rate=_interval(raw["invalid_rate"]),
        latency_s=_numbers(raw.get("latency_s") or {}),
        cost_per_task=_numbers(raw.get("cost_per_task") or {}),
    )


def _interval(raw: dict[str, Any]) -> Interval:
    value = float(raw["value"])
    return Interval(
        value=value,
        low=float(raw.get("low", value)),
        high=float(raw.get("high", value)),
        n=int(raw.get("n", 0)),
    )


def _optional(raw: dict[str, Any] | None) -> Interval | None:
    return None if raw is None else _interval(raw)


def _numbers(raw: Mapping[str, Any]) -> dict[str, float]:
    return {
        str(k): float(v)
        for k, v in raw.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
