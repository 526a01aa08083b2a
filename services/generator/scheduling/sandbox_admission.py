"""Sandbox-aware admission: a tool-using trajectory starts only while the sandbox pool has
a free session for it.

A sandbox instance refuses a session beyond its ``max_sessions``, and a refused session
is a tool failure: an infra-failed rollout, and a count toward the domain's quarantine,
for what was only a full pool.  So each sandbox instance publishes its free sessions
(``sessions_free`` in its Stats), and a generator holds a tool-using task in its slot
(the task stays in progress in its stream: queued, never dropped) until the pool has
room.

Reports are periodic, so the room is estimated between them, per trajectory admitted
here: until its session is open and a report has come in since, it holds a session the
reports do not show yet (one less); once a report has counted its session and the
trajectory has ended, that session is free again before the next report says so (one
more).  Sessions open lazily, at the first tool call, so a trajectory counts as unseen
from admission until then.  No fresh report (no sandbox instance, or none publishing)
means no gate: the tool calls then fail on their own, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: The Stats value a sandbox instance publishes its free sessions under.
FREE_SESSIONS = "sessions_free"


@dataclass(frozen=True)
class _Report:
    free: int
    at: float


class SandboxAdmission:
    def __init__(self, stale_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        #: A report older than this no longer counts (its instance may be gone).
        self.stale_s = stale_s
        self.waits = 0
        self.closed = False
        self._clock = clock
        self._reports: dict[str, _Report] = {}
        #: Trajectories admitted here and not ended: when each one's session opened.
        self._running: dict[str, float | None] = {}
        #: Sessions given back since the reports, by trajectories the reports counted.
        self._freed = 0
        self._changed = asyncio.Event()

    def report(self, instance: str, values: Mapping[str, float]) -> None:
        """A sandbox instance's Stats."""
        free = values.get(FREE_SESSIONS)
        if free is None:
            return
        self._reports[instance] = _Report(int(free), self._clock())
        self._freed = 0
        self._wake()

    def room(self) -> int | None:
        """Free sessions as far as this generator can tell; None when unknown."""
        fresh = self._fresh()
        if not fresh:
            return None
        since = _oldest(fresh)
        unseen = sum(1 for opened in self._running.values() if not _seen(opened, since))
        return sum(r.free for r in fresh) - unseen + self._freed

    async def admit(self, trajectories: list[str]) -> None:
        """Wait until a session is free for each trajectory, all at once (a task's samples
        taking them one by one could each hold part and wait for the rest); a task larger
        than the room goes when nothing of this generator's runs.  Once closed, a waiter
        is cancelled (the consumer hands its task back)."""
        waited = False
        while not self._fits(len(trajectories)):
            if self.closed:
                raise asyncio.CancelledError("sandbox admission closed: the generator stops")
            if not waited:
                self.waits, waited = self.waits + 1, True
            changed = self._changed
            # Woken by a report or an ended trajectory; the timeout lets reports go stale.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.stale_s):
                    await changed.wait()
        self._running.update((trajectory, None) for trajectory in trajectories)

    def opened(self, trajectory: str) -> None:
        """Its session is open: the next report counts it."""
        if trajectory in self._running:
            self._running[trajectory] = self._clock()

    def finished(self, trajectories: list[str]) -> None:
        since = self._since()
        for trajectory in trajectories:
            opened = self._running.pop(trajectory, None)
            if since is not None and _seen(opened, since):
                self._freed += 1  # the reports counted its session, given back now
        self._wake()

    def running(self) -> int:
        return len(self._running)

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _fits(self, sessions: int) -> bool:
        room = self.room()
        return room is None or room >= sessions or (room >= 1 and not self._running)

    def _fresh(self) -> list[_Report]:
        now = self._clock()
        return [r for r in self._reports.values() if now - r.at <= self.stale_s]

    def _since(self) -> float | None:
        fresh = self._fresh()
        return _oldest(fresh) if fresh else None

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


def _oldest(fresh: list[_Report]) -> float:
    """When the oldest fresh report came in: what every fresh report has seen."""
    return min(r.at for r in fresh)


def _seen(opened: float | None, since: float) -> bool:
    return opened is not None and opened < since
