"""The priority gate with simulated consumers: order, capacity, progress, close."""

from __future__ import annotations

import asyncio

import pytest

from services.runtime.priority import PriorityGate


class Sim:
    """Consumers of ``tiers`` queues sharing one gate; work items take ``work_s`` each."""

    def __init__(self, tiers: int, capacity: int, work_s: float = 0.005) -> None:
        self.gate = PriorityGate(tiers, capacity)
        self.queues: list[list[str]] = [[] for _ in range(tiers)]
        self.done: list[str] = []
        self.peak = 0
        self._running = 0
        self._work_s = work_s
        self._jobs: set[asyncio.Task[None]] = set()

    async def consumer(self, tier: int) -> None:
        while True:
            admission = await self.gate.admit(tier, 4, 0.05)
            if admission.slots == 0:
                self.gate.fetched(tier, 0)
                return
            queue = self.queues[tier]
            got = [queue.pop(0) for _ in range(min(admission.slots, len(queue)))]
            if not got:
                await asyncio.sleep(admission.wait_s)
            self.gate.fetched(tier, len(got))
            for item in got:
                job = asyncio.create_task(self._work(item))
                self._jobs.add(job)
                job.add_done_callback(self._jobs.discard)

    async def _work(self, item: str) -> None:
        self._running += 1
        self.peak = max(self.peak, self._running)
        await asyncio.sleep(self._work_s)
        self.done.append(item)
        self._running -= 1
        self.gate.finished()

    async def run_until(self, count: int, timeout_s: float = 5.0) -> None:
        consumers = [asyncio.create_task(self.consumer(t)) for t in range(len(self.queues))]
        try:
            async with asyncio.timeout(timeout_s):
                while len(self.done) < count:
                    await asyncio.sleep(0.005)
        finally:
            self.gate.close()
            await asyncio.gather(*consumers)


async def test_higher_tiers_first_and_capacity_never_exceeded() -> None:
    sim = Sim(tiers=3, capacity=2)
    sim.queues[2] = [f"c{i}" for i in range(5)]
    sim.queues[0] = [f"a{i}" for i in range(5)]
    sim.queues[1] = [f"b{i}" for i in range(5)]
    await sim.run_until(15)
    assert [item[0] for item in sim.done] == ["a"] * 5 + ["b"] * 5 + ["c"] * 5
    assert sim.peak <= 2


async def test_work_arriving_later_on_any_tier_is_taken() -> None:
    sim = Sim(tiers=4, capacity=1)
    sim.queues[1] = ["first"]

    async def later() -> None:
        await asyncio.sleep(0.3)
        sim.queues[3].append("low")
        await asyncio.sleep(0.3)
        sim.queues[0].append("high")

    feeder = asyncio.create_task(later())
    await sim.run_until(3)
    await feeder
    assert sim.done == ["first", "low", "high"]


async def test_high_tier_work_overtakes_a_busy_low_tier() -> None:
    sim = Sim(tiers=2, capacity=1, work_s=0.02)
    sim.queues[1] = [f"low{i}" for i in range(20)]

    async def urgent() -> None:
        await asyncio.sleep(0.1)
        sim.queues[0].append("urgent")

    feeder = asyncio.create_task(urgent())
    await sim.run_until(21)
    await feeder
    position = sim.done.index("urgent")
    assert 0 < position < 12, sim.done


async def test_close_releases_waiters() -> None:
    gate = PriorityGate(2, 1)
    waiting = asyncio.create_task(gate.admit(1, 1, 1.0))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # tier 1 waits until tier 0 has fetched once
    gate.close()
    admission = await asyncio.wait_for(waiting, 1.0)
    assert admission.slots == 0


async def test_a_tier_said_to_have_work_gets_the_next_free_slot() -> None:
    gate = PriorityGate(4, 1)
    gate.fetched(3, 1)  # tier 3 holds the one slot
    for tier in (0, 1, 2):
        gate.fetched(tier, 0)  # looked and found nothing: they yield their turns
    gate.work_waiting(0)  # then tier 0's stream holds a task
    turns: list[int] = []

    async def wait_turn(tier: int) -> None:
        await gate.admit(tier, 1, 0.05)
        turns.append(tier)

    low = asyncio.create_task(wait_turn(3))
    high = asyncio.create_task(wait_turn(0))
    await asyncio.sleep(0.01)
    gate.finished()  # the slot frees (a yield)
    await asyncio.sleep(0.01)
    assert turns == [0], "tier 0's, not the lower tier's"
    gate.fetched(0, 1)
    assert not low.done()
    await asyncio.wait_for(high, 1)
    low.cancel()


def test_gate_needs_a_tier_and_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one"):
        PriorityGate(0, 1)


async def test_an_idle_tier_only_looks_while_a_tier_with_work_waits_for_the_turn() -> None:
    """A tier whose last fetch found work is not held back by an idle tier's poll: an
    idle tier's fetch out when it comes back for more is told to stop, and one admitted
    while it waits gets no time to wait at all."""
    gate = PriorityGate(2, capacity=1)
    told: list[int] = []
    gate.on_busy_wait = told.append
    await gate.admit(0, 1, 1.0)
    gate.fetched(0, 0)  # tier 0: idle
    assert (await gate.admit(1, 1, 1.0)).wait_s == 1.0  # alone: the whole wait
    gate.fetched(1, 1)  # tier 1 has work
    gate.finished()
    # Tier 0's fetch is out when tier 1 comes back for more: the poll is to be cut short.
    assert (await gate.admit(0, 1, 1.0)).wait_s == 1.0
    again = asyncio.create_task(gate.admit(1, 1, 1.0))
    await asyncio.sleep(0)
    assert told == [1]
    gate.fetched(0, 0)
    await again
    gate.fetched(1, 1)  # the one slot is taken
    # Both wait for the slot: tier 0 goes first (priority), but only looks.
    first = asyncio.create_task(gate.admit(0, 1, 1.0))
    second = asyncio.create_task(gate.admit(1, 1, 1.0))
    await asyncio.sleep(0)
    gate.finished()
    assert (await first).wait_s == 0.0
    gate.fetched(0, 0)
    assert (await second).wait_s == 1.0
    gate.fetched(1, 0)
