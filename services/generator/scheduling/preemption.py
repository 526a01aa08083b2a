"""Preemption at a turn boundary: higher-tier work waiting behind a full generator takes
the slot of a running lower-tier multi-turn task.

Every ``check_s`` while every slot is taken, the generator asks the streams of the tiers
above its lowest running preemptible task how many tasks they hold besides those it runs
itself.  For each such task not yet covered by a yield already asked for, the running
preemptible task of the lowest priority (the latest started of the lowest tier) is asked
to yield: each of its samples stops at its next turn boundary, its state is saved into a
re-queued task (services.generator.agent, ``Task.resume``), and its slot goes to the
highest tier that has work: the gate is told that tier has work waiting, so the slot
is not taken by a lower tier first (services.runtime.priority).

A task parked at admission (waiting for the learner to catch up, or for sandbox room)
yields too, whatever its kind, and before any running one: it has started nothing, so
it goes back to its stream as it came (``Task.preemptions`` counted), and a held-out
evaluation is never stuck behind training tasks waiting for a learner that has stopped.

With several generator instances a task in flight on another instance counts as waiting
here: the cost of such a preemption is a save and a resume, never work.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from protocol.messages import Task
from services.runtime.priority import PriorityGate

#: Tasks a tier's stream holds (waiting and in flight, across all instances).
StreamDepth = Callable[[int], Awaitable[int]]


@dataclass(kw_only=True)
class Running:
    """One task being generated, and whether it was asked to yield."""

    tier: int
    order: int
    preemptible: bool
    yield_asked: bool = False
    #: Waiting at an admission gate (staleness, sandbox room): nothing started yet.
    parked: bool = False
    _asked: asyncio.Event = field(default_factory=asyncio.Event)

    def should_yield(self) -> bool:
        return self.yield_asked

    def ask(self) -> None:
        self.yield_asked = True
        self._asked.set()

    async def unless_asked(self, admission: Coroutine[Any, Any, None]) -> bool:
        """Wait at an admission gate; False if asked to yield first.  A task parked there
        has started nothing, so it goes back to its stream as it came, and its slot to
        higher-tier work (a held-out evaluation behind training tasks that wait for the
        learner)."""
        self.parked = True
        admitted = asyncio.ensure_future(admission)
        asked = asyncio.ensure_future(self._asked.wait())
        try:
            await asyncio.wait({admitted, asked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.parked = False
            asked.cancel()
            admitted.cancel()  # a no-op once it is done; the gates count nothing before
        if not admitted.done() or (admitted.cancelled() and self.yield_asked):
            return False
        admitted.result()  # a gate closed by a stopping service cancels the task
        if not self.preemptible:
            # Admitted as it was asked: it runs to its end, so the ask is not pending.
            self.yield_asked = False
            self._asked.clear()
        return True


def preemptible(task: Task) -> bool:
    """Only a task with turns left to yield between (several turns, tools) can yield
    while it runs; any task can while it is parked at admission."""
    return task.max_turns > 1 and bool(task.tools)


class Preemption:
    def __init__(self, gate: PriorityGate, depth: StreamDepth, *, check_s: float, on: bool) -> None:
        self._gate = gate
        self._depth = depth
        self._check_s = check_s
        self.on = on
        self._running: dict[int, Running] = {}
        self._order = itertools.count()
        #: Tasks asked to yield (each yields one or more samples).
        self.asked = 0

    def started(self, key: int, task: Task, tier: int) -> Running:
        running = Running(tier=tier, order=next(self._order), preemptible=preemptible(task))
        self._running[key] = running
        return running

    def finished(self, key: int) -> None:
        self._running.pop(key, None)

    def running(self) -> int:
        return len(self._running)

    async def run(self) -> None:
        while self.on:
            await asyncio.sleep(self._check_s)
            if self.on:
                await self.check()

    def stop(self) -> None:
        """No more checks: the loop ends by itself, even where a cancellation of it was
        lost (a JetStream request can swallow one as it completes)."""
        self.on = False

    async def check(self) -> None:
        stats = self._gate.statistics()
        if stats.in_flight < stats.capacity:
            return  # a free slot: waiting work gets it without anyone yielding
        victims = self._victims()
        if not victims:
            return
        asked = sum(r.yield_asked for r in self._running.values())
        for tier in range(max(r.tier for r in victims)):
            here = sum(r.tier == tier for r in self._running.values())
            waiting = await self._depth(tier) - here
            if waiting > 0:
                self._gate.work_waiting(tier)  # the slot freed is this tier's
            waiting -= asked
            below = [r for r in victims if r.tier > tier and not r.yield_asked]
            for running in below[: max(waiting, 0)]:
                running.ask()
                self.asked += 1
                asked += 1

    def _victims(self) -> list[Running]:
        """Tasks that can yield, not yet asked: parked ones first (they lose nothing),
        then the lowest priority (latest started first)."""
        candidates = [
            r for r in self._running.values() if (r.preemptible or r.parked) and not r.yield_asked
        ]
        return sorted(candidates, key=lambda r: (not r.parked, -r.tier, -r.order))
