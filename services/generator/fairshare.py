"""Weighted fair share between domains (or tenants) inside one priority tier.

Start-time fair queueing: each key has a virtual clock that advances by ``1 / weight``
for every task it starts, and the next task goes to the backlogged key whose clock is
lowest.  Over any busy period a backlogged key therefore gets ``weight / sum(weights of
the backlogged keys)`` of the starts, whatever the others' queue lengths: a flood of one
domain delays the others by at most one task each round, never indefinitely.

A key that was idle rejoins at the virtual time (the clock of the key picked last)
instead of its old, lower clock, so idleness earns no burst that would starve the keys
that kept working.

``min_share`` is a floor on the share of any backlogged key however small its weight
(a weight of 0.001 against 1,000 domains of weight 1 would otherwise round to nothing):
its effective weight is raised to ``min_share`` of the backlogged keys' total.

Weights change at run time (:meth:`set_weight`); a change takes effect from the next
start.  Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ShareStatistics:
    #: Tasks started per key since the scheduler was made.
    started: Mapping[str, int]
    #: Current weight per key that has one set (others have the default).
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
        for key, weight in (weights or {}).items():
            self.set_weight(key, weight)
        self._clock: dict[str, float] = {}
        #: Virtual time: the clock of the key picked last (never decreases).
        self._now = 0.0
        self._started: dict[str, int] = {}

    def set_weight(self, key: str, weight: float) -> None:
        if weight <= 0:
            raise ValueError(f"weight of {key!r} must be positive, got {weight}")
        self._weights[key] = weight

    def weight(self, key: str) -> float:
        return self._weights.get(key, self.default_weight)

    def pick(self, backlogged: Iterable[str]) -> str | None:
        """The key whose task should start next, of those with work waiting; None if none.
        Ties go to the key first in ``backlogged``."""
        keys = list(dict.fromkeys(backlogged))
        if not keys:
            return None
        for key in keys:
            # Idle keys (and new ones) rejoin at the virtual time: no saved-up burst.
            self._clock[key] = max(self._clock.get(key, self._now), self._now)
        chosen = min(keys, key=lambda k: self._clock[k])
        self._now = self._clock[chosen]
        return chosen

    def started(self, key: str, backlogged: Iterable[str] = ()) -> None:
        """Charge ``key`` for one started task; ``backlogged`` (the keys with work waiting,
        ``key`` included or not) sets the floor that ``min_share`` guarantees."""
        self._clock[key] = self._clock.get(key, 0.0) + 1.0 / self._effective(key, backlogged)
        self._started[key] = self._started.get(key, 0) + 1

    def _effective(self, key: str, backlogged: Iterable[str]) -> float:
        weight = self.weight(key)
        if not self.min_share:
            return weight
        total = sum(self.weight(k) for k in {*backlogged, key})
        return max(weight, self.min_share * total)

    def forget(self, key: str) -> None:
        """Drop a key's clock (a domain removed from the config); its count stays."""
        self._clock.pop(key, None)

    def statistics(self) -> ShareStatistics:
        return ShareStatistics(started=dict(self._started), weights=dict(self._weights))
