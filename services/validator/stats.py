"""Per-domain statistics: Prometheus metrics, and figures for the stats subject.

Prometheus (``temper_validator_*``): rollouts by domain and status, the reward
summary (``_sum`` / ``_count`` give the mean), passes, and per-validator-kind
outcomes and latency.  The stats subject gets, per domain seen so far,
``domain.<name>.{rollouts,mean_reward,pass_rate,infra_failure_rate,invalid_rate}``.

Everything is counted in plain numbers and turned into metrics when the registry is
read: a rule validator judges a rollout in microseconds, and five labelled Prometheus
updates per rollout (each under a lock) would take longer than that.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from protocol.messages import ScoreStatus

#: Label for rollouts of domains the registry does not know: their names are unbounded.
UNKNOWN = "_unknown"
_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60)
#: Upper bounds with +Inf last, so that every observation has a bucket.
_BOUNDS = (*(float(bound) for bound in _BUCKETS), math.inf)
#: Their ``le`` labels, written as prometheus_client writes them ("0.001", "1.0", "+Inf").
_LE = (*(repr(bound) for bound in _BOUNDS[:-1]), "+Inf")
ROLLOUTS = "temper_validator_rollouts"
REWARD = "temper_validator_reward"
PASSED = "temper_validator_passed"
RUNS = "temper_validator_runs"
SECONDS = "temper_validator_seconds"


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

    def by_status(self) -> Iterator[tuple[ScoreStatus, int]]:
        """Rollouts per outcome, those seen at least once."""
        counts = (
            (ScoreStatus.SCORED, self.scored),
            (ScoreStatus.INFRA_FAILURE, self.infra_failures),
            (ScoreStatus.INVALID, self.invalid),
        )
        return ((status, count) for status, count in counts if count)


@dataclass
class Latency:
    """One validator kind's latency histogram: a count per bucket (not cumulative) and the sum."""

    counts: list[int] = field(default_factory=lambda: [0] * len(_BOUNDS))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        # The first bound >= seconds: Prometheus buckets hold what is <= their bound.
        self.counts[bisect.bisect_left(_BOUNDS, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, float]]:
        cumulative, out = 0, []
        for le, count in zip(_LE, self.counts, strict=True):
            cumulative += count
            out.append((le, float(cumulative)))
        return out


class DomainStats:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._tallies: dict[str, Tally] = {}
        self._runs: dict[tuple[str, ScoreStatus], int] = {}
        self._latency: dict[str, Latency] = {}
        registry.register(self)

    def observe_run(self, kind: str, status: ScoreStatus, seconds: float) -> None:
        key = (kind, status)
        self._runs[key] = self._runs.get(key, 0) + 1
        latency = self._latency.get(kind)
        if latency is None:
            latency = self._latency[kind] = Latency()
        latency.observe(seconds)

    def record(
        self, domain: str, status: ScoreStatus, reward: float, threshold: float | None
    ) -> None:
        """Count one published result; ``threshold`` is None for an unknown domain."""
        label = domain if threshold is not None else UNKNOWN
        tally = self._tallies.get(label)
        if tally is None:
            tally = self._tallies[label] = Tally()
        tally.rollouts += 1
        if status is ScoreStatus.INFRA_FAILURE:
            tally.infra_failures += 1
        elif status is ScoreStatus.INVALID:
            tally.invalid += 1
        else:
            tally.scored += 1
            tally.reward_sum += reward
            # A small epsilon: a sum of weighted scores that should be 1.0 may land at 0.9999999.
            if threshold is not None and reward >= threshold - 1e-9:
                tally.passed += 1

    def tally(self, domain: str) -> Tally:
        return self._tallies.get(domain, Tally())

    def values(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for domain, tally in self._tallies.items():
            out.update({f"domain.{domain}.{k}": v for k, v in tally.figures().items()})
        return out

    def describe(self) -> list[Metric]:
        """The metric names, for the registry's check against duplicates."""
        return list(_families())

    def collect(self) -> list[Metric]:
        """The metrics as they stand; the registry calls this when it is read."""
        rollouts, reward, passed, runs, latency = _families()
        for domain, tally in self._tallies.items():
            for status, count in tally.by_status():
                rollouts.add_metric([domain, status.value], count)
            if tally.scored:
                reward.add_metric([domain], tally.scored, tally.reward_sum)
            if tally.passed:
                passed.add_metric([domain], tally.passed)
        for (kind, status), count in self._runs.items():
            runs.add_metric([kind, status.value], count)
        for kind, seconds in self._latency.items():
            latency.add_metric([kind], seconds.buckets(), seconds.total)
        return [rollouts, reward, passed, runs, latency]


def _families() -> tuple[
    CounterMetricFamily,
    SummaryMetricFamily,
    CounterMetricFamily,
    CounterMetricFamily,
    HistogramMetricFamily,
]:
    """Empty metric families, in the order :meth:`DomainStats.collect` fills them."""
    by_outcome, by_domain = ["domain", "status"], ["domain"]
    return (
        CounterMetricFamily(ROLLOUTS, "Rollouts judged, by domain and outcome", labels=by_outcome),
        SummaryMetricFamily(REWARD, "Rewards of scored rollouts", labels=by_domain),
        CounterMetricFamily(
            PASSED,
            "Scored rollouts whose reward reached the domain's pass threshold",
            labels=by_domain,
        ),
        CounterMetricFamily(
            RUNS, "Validator runs, by validator kind and outcome", labels=["kind", "status"]
        ),
        HistogramMetricFamily(SECONDS, "Validator latency by kind", labels=["kind"]),
    )
