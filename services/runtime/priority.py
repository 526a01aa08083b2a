"""Strict priority across pull consumers: a tier fetches only while no higher tier has work.

One consumer per tier stream shares a :class:`PriorityGate`.  Fetches are taken one at a
time, which keeps the shared capacity exact (no two tiers can each fetch the last free
slot).  The turn goes to the highest tier that may fetch; a tier whose last fetch came
back empty lets the others go first until some fetch finds work again, and polls only
briefly while others wait, so an idle high tier costs the lower ones little: not at all
while one of them has work (it only looks), and a poll already out when such a tier
comes back for the turn is cut short (``on_busy_wait``).  A tier
counts as busy (holding lower tiers back) from a fetch that returned work until one that
returned none, and from the start until its first fetch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

#: Long-poll of an idle tier while other tiers wait for the turn.
SHORT_POLL_S = 0.05


@dataclass(frozen=True, kw_only=True)
class GateStatistics:
    capacity: int
    in_flight: int
    busy_tiers: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Admission:
    #: Messages this fetch may take (0: fetch nothing, the gate is closed).
    slots: int
    #: How long the fetch may wait for messages.
    wait_s: float


class PriorityGate:
    """Shared admission control of the consumers of tiers ``0 .. tiers-1`` (0 first)."""

    def __init__(self, tiers: int, capacity: int) -> None:
        if tiers < 1 or capacity < 1:
            raise ValueError("a priority gate needs at least one tier and one slot")
        self.tiers = tiers
        self.capacity = capacity
        self._busy = [True] * tiers
        self._yielded = [False] * tiers
        self._waiting: set[int] = set()
        self._fetching = False
        self._closed = False
        self._in_flight = 0
        # Replaced on every change: waiters re-check when it is set.  State changes stay
        # synchronous, so a cancelled consumer can never leave the counts wrong.
        self._changed = asyncio.Event()
        #: Told the tier when a tier with work starts waiting while another one's fetch
        #: is out (it may be a poll the caller can cut short: the turn is wanted).
        self.on_busy_wait: Callable[[int], None] | None = None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _eligible(self, tier: int) -> bool:
        return not any(self._busy[:tier]) and self._in_flight < self.capacity

    def _my_turn(self, tier: int) -> bool:
        if self._fetching or not self._eligible(tier):
            return False
        ready = sorted(t for t in self._waiting if self._eligible(t))
        fresh = [t for t in ready if not self._yielded[t]]
        return tier == (fresh or ready)[0]

    async def admit(self, tier: int, wanted: int, wait_s: float) -> Admission:
        """Wait for this tier's turn to fetch; the fetch must be followed by :meth:`fetched`."""
        self._waiting.add(tier)
        if self._fetching and self._busy[tier] and self.on_busy_wait is not None:
            self.on_busy_wait(tier)
        try:
            while not self._closed and not self._my_turn(tier):
                await self._changed.wait()
        finally:
            self._waiting.discard(tier)
        if self._closed:
            return Admission(slots=0, wait_s=0.0)
        self._fetching = True
        slots = min(wanted, self.capacity - self._in_flight)
        return Admission(slots=slots, wait_s=self._poll_s(wait_s))

    def _poll_s(self, wait_s: float) -> float:
        """How long the admitted fetch may wait for work: its whole ``wait_s`` alone, a
        short poll while other tiers wait for the turn, and none while one of them has
        work (a look is enough: waiting would only hold that work back)."""
        if any(self._busy[tier] for tier in self._waiting):
            return 0.0
        return min(wait_s, SHORT_POLL_S) if self._waiting else wait_s

    def is_waiting(self, tier: int) -> bool:
        """Whether ``tier``'s consumer waits for the turn to fetch."""
        return tier in self._waiting

    def fetched(self, tier: int, got: int) -> None:
        """The admitted fetch returned ``got`` messages, now in flight."""
        self._fetching = False
        self._in_flight += got
        self._busy[tier] = got > 0
        self._yielded[tier] = not got
        if got or all(self._yielded):
            # Work found, or every tier had its turn: a new round, highest tier first.
            self._yielded = [False] * self.tiers
        self._notify()

    def finished(self) -> None:
        self._in_flight -= 1
        self._notify()

    def work_waiting(self, tier: int) -> None:
        """``tier`` is known to have work waiting (its stream said so): it counts as busy,
        so the next free slot is its to fetch, not a lower tier's, even where its last
        fetch came back empty.  The fetch's result decides again."""
        if not self._busy[tier] or self._yielded[tier]:
            self._busy[tier] = True
            self._yielded[tier] = False
            self._notify()

    def close(self) -> None:
        """Stop admitting: every waiting and later :meth:`admit` returns zero slots."""
        self._closed = True
        self._notify()

    def statistics(self) -> GateStatistics:
        busy = tuple(tier for tier, flag in enumerate(self._busy) if flag)
        return GateStatistics(capacity=self.capacity, in_flight=self._in_flight, busy_tiers=busy)
