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

With several generator instances a task in flight on another instance counts as waiting
here: the cost of such a preemption is a save and a resume, never work.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

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

    def should_yield(self) -> bool:
        return self.yield_asked


def preemptible(task: Task) -> bool:
    """Only a task with turns left to yield between (several turns, tools) can yield."""
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
                running.yield_asked = True
                self.asked += 1
                asked += 1

    def _victims(self) -> list[Running]:
        """Preemptible tasks not yet asked, lowest priority first (latest started first)."""
        candidates = [r for r in self._running.values() if r.preemptible and not r.yield_asked]
        return sorted(candidates, key=lambda r: (-r.tier, -r.order))
