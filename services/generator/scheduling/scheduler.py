"""A generator's domain scheduling: fair share (between domains, and between the tenants
of each) and quarantine, in-flight counts, and the ``temper domain`` control requests
that change them at run time.

One :class:`DomainScheduler` per generator instance is shared by the intake of every
tier (:mod:`services.generator.scheduling.intake`), which asks it whom to take next, and by the
task handler, which reports each task's start and its rollouts.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from protocol.messages import (
    DomainControl,
    DomainSchedule,
    DomainSchedules,
    FailureKind,
    Rollout,
    RolloutStatus,
    ScoredRollout,
    ScoreStatus,
    TenantSchedule,
)
from services.generator.scheduling.fairshare import FairShare, Flow
from services.generator.scheduling.intake import Fairness
from services.generator.scheduling.quarantine import (
    DomainState,
    Quarantine,
    Quarantined,
    QuarantineSettings,
)


@dataclass(frozen=True, kw_only=True)
class SchedulingSettings:
    #: Floor on a backlogged flow's share of its tier (a domain's, or one tenant's of a
    #: domain), whatever its weight.
    min_share: float = 0.01
    #: Hold domains whose tool infrastructure keeps failing (see quarantine.py).
    quarantine: bool = True
    quarantine_window_s: float = 300.0
    quarantine_min_samples: int = 20
    quarantine_threshold: float = 0.5
    quarantine_probe_s: float = 60.0
    #: Count the validator's infrastructure failures too (its unit-test sandbox, a reward
    #: model): every instance listens to the scored rollouts for those of its own.
    quarantine_validator: bool = True
    #: With nothing to take, a tier waits for a publish; it asks the stream anyway this
    #: often, for tasks that come back without one (naks elsewhere, ack timeouts).
    idle_refresh_s: float = 2.0

    def quarantine_settings(self) -> QuarantineSettings:
        return QuarantineSettings(
            window_s=self.quarantine_window_s,
            min_samples=self.quarantine_min_samples,
            threshold=self.quarantine_threshold,
            probe_after_s=self.quarantine_probe_s,
            max_probe_after_s=max(self.quarantine_probe_s, 15 * self.quarantine_probe_s),
        )


def infra_failure_of_domain(rollout: Rollout) -> bool:
    """The domain's own infrastructure failed: its tools (the sandbox).  An engine failure
    hits every domain alike and says nothing about this one."""
    return rollout.status is RolloutStatus.INFRA_FAILURE and rollout.failure is FailureKind.TOOL


def judged_infra_failure(scored: ScoredRollout, generator: str) -> bool:
    """The validator failed on its infrastructure judging a rollout that ``generator``
    produced intact.

    A rollout that failed in generation is passed on unjudged as an infra failure: its
    generator counted it already.  Another instance's rollouts are left to that instance:
    counting their failures here but not their successes would inflate the share.
    """
    rollout = scored.rollout
    return (
        scored.status is ScoreStatus.INFRA_FAILURE
        and rollout.status is not RolloutStatus.INFRA_FAILURE
        and rollout.generator == generator
    )


class DomainScheduler:
    def __init__(
        self,
        settings: SchedulingSettings,
        weights: Mapping[str, float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.share = FairShare(weights, min_share=settings.min_share)
        self.quarantine = Quarantine(settings.quarantine_settings())
        self.fairness = Fairness(
            share=self.share,
            quarantine=self.quarantine,
            idle_refresh_s=settings.idle_refresh_s,
            clock=clock,
        )
        self._clock = clock
        self._in_flight: Counter[Flow] = Counter()
        #: The validator's infrastructure failures of this instance's rollouts, counted.
        self.judged_failures = 0

    def started(self, flow: Flow) -> None:
        self._in_flight[flow] += 1

    def finished(self, flow: Flow) -> None:
        self._in_flight[flow] -= 1
        if self._in_flight[flow] <= 0:
            del self._in_flight[flow]

    def generated(self, domain: str, rollouts: Iterable[Rollout]) -> None:
        """A task's rollouts, before they are published: the validator's report on one
        then always comes later, and replaces the generator's outcome."""
        if not self.settings.quarantine:
            return
        now = self._clock()
        for rollout in rollouts:
            failed = infra_failure_of_domain(rollout)
            self.quarantine.record(domain, rollout.id, infra_failure=failed, now=now)

    def judged(self, scored: ScoredRollout, generator: str) -> bool:
        """A validator's result; whether it counted (see :func:`judged_infra_failure`)."""
        if not (self.settings.quarantine and judged_infra_failure(scored, generator)):
            return False
        rollout, now = scored.rollout, self._clock()
        self.quarantine.record(rollout.task.domain, rollout.id, infra_failure=True, now=now)
        self.judged_failures += 1
        return True

    def control(self, request: DomainControl, instance: str) -> DomainSchedules:
        applied = False
        if request.domain and request.share_weight is not None:
            self.share.set_weight(request.domain, request.share_weight)
            applied = True
        if request.domain and request.resume:
            applied = self.quarantine.resume(request.domain) or applied
        return DomainSchedules(instance=instance, applied=applied, domains=self.schedules())

    def schedules(self) -> list[DomainSchedule]:
        started = self.share.statistics().started
        held = {q.domain: q for q in self.quarantine.quarantined()}
        flows: dict[str, list[Flow]] = defaultdict(list)
        for flow in sorted({*started, *self._in_flight}):
            flows[flow.domain].append(flow)
        return [
            self._schedule(name, flows.get(name, []), started, held.get(name))
            for name in sorted(flows.keys() | held.keys())
        ]

    def _schedule(
        self, domain: str, flows: list[Flow], started: Mapping[Flow, int], held: Quarantined | None
    ) -> DomainSchedule:
        tenants = [
            TenantSchedule(
                tenant=f.tenant, started=started.get(f, 0), in_flight=self._in_flight.get(f, 0)
            )
            for f in flows
        ]
        return DomainSchedule(
            domain=domain,
            state=self.quarantine.state(domain).value,
            share_weight=self.share.weight(domain),
            started=sum(t.started for t in tenants),
            in_flight=sum(t.in_flight for t in tenants),
            failure_rate=held.failure_rate if held is not None else 0.0,
            # Per tenant once the domain had a named one; else the domain's line says it all.
            tenants=tenants if any(t.tenant for t in tenants) else [],
        )

    def _domain_in_flight(self) -> Counter[str]:
        by_domain: Counter[str] = Counter()
        for flow, count in self._in_flight.items():
            by_domain[flow.domain] += count
        return by_domain

    def held(self) -> list[str]:
        return [q.domain for q in self.quarantine.quarantined()]

    def in_flight(self, limit: int = 5) -> str:
        """``a:3,b:1``: tasks in flight per domain, the busiest ``limit`` (for ``temper
        status``; ``temper domain status`` lists them all)."""
        busiest = self._domain_in_flight().most_common()
        shown = ",".join(f"{domain}:{count}" for domain, count in busiest[:limit])
        return shown + (f",+{len(busiest) - limit} more" if len(busiest) > limit else "")

    def statistics(self) -> dict[str, float]:
        return {
            "quarantined_domains": float(len(self.held())),
            "domains_in_flight": float(len(self._domain_in_flight())),
            "validator_infra_failures": float(self.judged_failures),
        }

    def state(self, domain: str) -> DomainState:
        return self.quarantine.state(domain)
