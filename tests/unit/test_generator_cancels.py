"""A gateway call cancelled by its caller stops where it runs and is dropped where it has
not started; a generator stopping still hands its calls back."""

from __future__ import annotations

import asyncio

import pytest

from protocol.messages import CallCancel
from services.generator.cancels import CallCancels


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_call_cancelled_before_it_starts_never_runs() -> None:
    cancels = CallCancels(Clock())
    cancels.cancel(CallCancel(task_id="gwc-1", until=2000.0))
    ran: list[str] = []

    async def work() -> str:
        ran.append("gwc-1")
        return "answer"

    assert await cancels.run("gwc-1", work()) is None
    assert ran == [] and cancels.dropped == 1 and cancels.stopped == 0
    assert await cancels.run("gwc-2", work()) == "answer"


async def test_a_running_call_stops_at_its_cancel() -> None:
    cancels = CallCancels(Clock())
    started = asyncio.Event()
    stopped = asyncio.Event()

    async def work() -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()
        return "never"

    running = asyncio.create_task(cancels.run("gwc-1", work()))
    await started.wait()
    cancels.cancel(CallCancel(task_id="gwc-1", until=2000.0))
    assert await asyncio.wait_for(running, 5) is None
    assert stopped.is_set() and cancels.stopped == 1
    assert cancels.statistics()["calls_cancelled_running"] == 1


async def test_a_stopping_generator_still_hands_the_call_back() -> None:
    """The handler's own cancel (the service stopping) is no caller's cancel: it goes on
    up, so the consumer naks the task; so does a cancel raised inside the work."""
    cancels = CallCancels(Clock())
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.sleep(60)

    running = asyncio.create_task(cancels.run("gwc-1", work()))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    async def closed() -> None:
        raise asyncio.CancelledError("admission closed")

    with pytest.raises(asyncio.CancelledError):
        await cancels.run("gwc-2", closed())
    assert cancels.stopped == 0 and cancels.dropped == 0


async def test_a_cancel_is_forgotten_after_its_call_deadline() -> None:
    clock = Clock()
    cancels = CallCancels(clock)
    cancels.cancel(CallCancel(task_id="gwc-old", until=1010.0))
    assert cancels.is_cancelled("gwc-old")
    clock.now = 1011.0
    assert not cancels.is_cancelled("gwc-old")
    cancels.cancel(CallCancel(task_id="gwc-new", until=1100.0))
    assert set(cancels._cancelled) == {"gwc-new"}
