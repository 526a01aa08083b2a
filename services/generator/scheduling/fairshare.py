"""Weighted fair share between the flows of one priority tier: each domain's tasks of
one tenant.

Start-time fair queueing: each flow has a virtual clock that advances by ``1 / weight``
for every task it starts, and the next task goes to the backlogged flow whose clock is
lowest.  Over any busy period a backlogged flow therefore gets ``weight / sum(weights of
the backlogged flows)`` of the starts, whatever the others' queue lengths: a flood of one
flow delays the others by at most one task each round, never indefinitely.

The share is hierarchical.  Weights belong to domains, and the tenants of a domain with
work waiting split its weight equally: a flow's weight is its domain's divided by the
number of that domain's backlogged flows.  Domains therefore share the tier by their
weights however many tenants each has, and a flood of one tenant leaves the other
tenants of its domain their equal part of the domain's share.

A flow that was idle rejoins at the virtual time (the clock of the flow picked last)
instead of its old, lower clock, so idleness earns no burst that would starve the flows
that kept working.

Weights change at run time (:meth:`set_weight`); a change takes effect from the next
start.  Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, order=True, slots=True)
class Flow:
    """The tasks of one domain and one tenant in a tier (``""``: the default tenant)."""

    domain: str
    tenant: str = ""

    def __str__(self) -> str:
        return f"{self.domain}/{self.tenant}" if self.tenant else self.domain


@dataclass(frozen=True, kw_only=True)
class ShareStatistics:
    #: Tasks started per flow since the scheduler was made.
    started: Mapping[Flow, int]
    #: Current weight per domain that has one set (others have the default).
    weights: Mapping[str, float]


class FairShare:
    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        *,
        default_weight: float = 1.0,
        min_share: float = 0.0,
    ) -> None:
        if default_weight <= 0:
            raise ValueError(f"default_weight must be positive, got {default_weight}")
        if not 0.0 <= min_share < 1.0:
            raise ValueError(f"min_share must be in [0, 1), got {min_share}")
        self.default_weight = default_weight
        self.min_share = min_share
        self._weights: dict[str, float] = {}
        for domain, weight in (weights or {}).items():
            self.set_weight(domain, weight)
        self._clock: dict[Flow, float] = {}
        #: Virtual time: the clock of the flow picked last (never decreases).
        self._now = 0.0
        self._started: dict[Flow, int] = {}

    def set_weight(self, domain: str, weight: float) -> None:
        if weight <= 0:
            raise ValueError(f"weight of {domain!r} must be positive, got {weight}")
        self._weights[domain] = weight

    def weight(self, domain: str) -> float:
        return self._weights.get(domain, self.default_weight)

    def pick(self, backlogged: Iterable[Flow]) -> Flow | None:
        """The flow whose task should start next, of those with work waiting; None if none.
        Ties go to the flow first in ``backlogged``."""
        flows = list(dict.fromkeys(backlogged))
        if not flows:
            return None
        for flow in flows:
            # Idle flows (and new ones) rejoin at the virtual time: no saved-up burst.
            self._clock[flow] = max(self._clock.get(flow, self._now), self._now)
        chosen = min(flows, key=lambda f: self._clock[f])
        self._now = self._clock[chosen]
        return chosen

    def started(self, flow: Flow, backlogged: Iterable[Flow] = ()) -> None:
        """Charge ``flow`` for one started task; ``backlogged`` (the flows with work
        waiting, ``flow`` included or not) decides how many tenants split its domain's
        weight, and the floor that ``min_share`` guarantees."""
        charge = 1.0 / self._effective(flow, {*backlogged, flow})
        self._clock[flow] = self._clock.get(flow, 0.0) + charge
        self._started[flow] = self._started.get(flow, 0) + 1

    def _effective(self, flow: Flow, backlogged: set[Flow]) -> float:
        tenants = sum(1 for f in backlogged if f.domain == flow.domain)
        weight = self.weight(flow.domain) / tenants
        if not self.min_share:
            return weight
        # The domains' weights, each split among its tenants: the flows' total.
        total = sum(self.weight(domain) for domain in {f.domain for f in backlogged})
        return max(weight, self.min_share * total)

    def forget(self, flow: Flow) -> None:
        """Drop a flow's clock (a domain removed from the config); its count stays."""
        self._clock.pop(flow, None)

    def statistics(self) -> ShareStatistics:
        return ShareStatistics(started=dict(self._started), weights=dict(self._weights))
