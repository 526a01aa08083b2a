"""Per-domain statistics: Prometheus metrics, and figures for the stats subject.

Prometheus (``temper_validator_*``): rollouts by domain and status, the reward
summary (``_sum`` / ``_count`` give the mean), passes, and per-validator-kind
outcomes and latency.  The stats subject gets, per domain seen so far,
``domain.<name>.{rollouts,mean_reward,pass_rate,infra_failure_rate,invalid_rate}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary

from protocol.messages import ScoredRollout, ScoreStatus

#: Label for rollouts of domains the registry does not know: their names are unbounded.
UNKNOWN = "_unknown"
_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class Tally:
    rollouts: int = 0
    scored: int = 0
    passed: int = 0
    infra_failures: int = 0
    invalid: int = 0
    reward_sum: float = 0.0

    def figures(self) -> dict[str, float]:
        seen = max(1, self.rollouts)
        return {
            "rollouts": float(self.rollouts),
            "mean_reward": self.reward_sum / self.scored if self.scored else 0.0,
            "pass_rate": self.passed / self.scored if self.scored else 0.0,
            "infra_failure_rate": self.infra_failures / seen,
            "invalid_rate": self.invalid / seen,
        }


_Labelled = TypeVar("_Labelled", Counter, Summary)


class DomainStats:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._tallies: dict[str, Tally] = {}
        self._children: dict[tuple[object, ...], Any] = {}
        self._run_children: dict[tuple[str, ScoreStatus], tuple[Counter, Histogram]] = {}
        self._rollouts = Counter(
            "temper_validator_rollouts",
            "Rollouts judged, by domain and outcome",
            ["domain", "status"],
            registry=registry,
        )
        self._reward = Summary(
            "temper_validator_reward", "Rewards of scored rollouts", ["domain"], registry=registry
        )
        self._passed = Counter(
            "temper_validator_passed",
            "Scored rollouts whose reward reached the domain's pass threshold",
            ["domain"],
            registry=registry,
        )
        self._runs = Counter(
            "temper_validator_runs",
            "Validator runs, by validator kind and outcome",
            ["kind", "status"],
            registry=registry,
        )
        self._latency = Histogram(
            "temper_validator_seconds",
            "Validator latency by kind",
            ["kind"],
            buckets=_BUCKETS,
            registry=registry,
        )

    def observe_run(self, kind: str, status: ScoreStatus, seconds: float) -> None:
        # Labelled children resolved once each: the label lookup costs more than the update.
        key = (kind, status)
        if key not in self._run_children:
            self._run_children[key] = (
                self._runs.labels(kind=kind, status=status.value),
                self._latency.labels(kind=kind),
            )
        runs, latency = self._run_children[key]
        runs.inc()
        latency.observe(seconds)

    def record(self, domain: str, scored: ScoredRollout, threshold: float | None) -> None:
        """Count one published result; ``threshold`` is None for an unknown domain."""
        label = domain if threshold is not None else UNKNOWN
        tally = self._tallies.setdefault(label, Tally())
        tally.rollouts += 1
        self._child(self._rollouts, label, scored.status.value).inc()
        if scored.status is ScoreStatus.INFRA_FAILURE:
            tally.infra_failures += 1
        elif scored.status is ScoreStatus.INVALID:
            tally.invalid += 1
        else:
            tally.scored += 1
            tally.reward_sum += scored.reward
            self._child(self._reward, label).observe(scored.reward)
            # A small epsilon: a sum of weighted scores that should be 1.0 may land at 0.9999999.
            if threshold is not None and scored.reward >= threshold - 1e-9:
                tally.passed += 1
                self._child(self._passed, label).inc()

    def _child(self, metric: _Labelled, *labels: str) -> _Labelled:
        """``metric.labels(*labels)``, resolved once: the lookup costs more than the update."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def tally(self, domain: str) -> Tally:
        return self._tallies.get(domain, Tally())

    def values(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for domain, tally in self._tallies.items():
            out.update({f"domain.{domain}.{k}": v for k, v in tally.figures().items()})
        return out
