"""run_to_end: clean-up that a cancellation must not cut short."""

from __future__ import annotations

import asyncio

import pytest

from services.runtime.tasks import run_to_end


async def _slow_cleanup(steps: list[str], release: asyncio.Event) -> str:
    steps.append("started")
    await release.wait()
    steps.append("finished")
    return "done"


async def test_the_result_comes_back_when_nothing_cancels() -> None:
    release = asyncio.Event()
    release.set()
    assert await run_to_end(_slow_cleanup([], release)) == "done"


async def test_cancelled_caller_waits_for_the_work_then_is_cancelled() -> None:
    steps: list[str] = []
    release = asyncio.Event()
    caller = asyncio.create_task(run_to_end(_slow_cleanup(steps, release)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert steps == ["started"]
    caller.cancel()
    await asyncio.sleep(0.01)
    assert not caller.done()  # still waiting for the clean-up, not abandoned
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert steps == ["started", "finished"]


async def test_a_second_cancellation_ends_the_wait_but_not_the_work() -> None:
    steps: list[str] = []
    release = asyncio.Event()
    caller = asyncio.create_task(run_to_end(_slow_cleanup(steps, release)))
    await asyncio.sleep(0)
    caller.cancel()
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert steps == ["started", "finished"]


async def test_the_works_own_error_reaches_the_caller() -> None:
    async def broken() -> None:
        raise OSError("engine gone")

    with pytest.raises(OSError, match="engine gone"):
        await run_to_end(broken())
