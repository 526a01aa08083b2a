"""Sandbox-aware admission (services/generator/scheduling/sandbox_admission.py): tool-using
tasks start only while the sandbox pool reports a free session, estimated between reports."""

from __future__ import annotations

import asyncio

import pytest

from services.generator.scheduling.sandbox_admission import FREE_SESSIONS, SandboxAdmission


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _room(stale_s: float = 30.0) -> tuple[SandboxAdmission, Clock]:
    clock = Clock()
    return SandboxAdmission(stale_s, clock=clock), clock


async def _pending(waiter: asyncio.Future[None]) -> bool:
    await asyncio.sleep(0.01)
    return not waiter.done()


async def test_without_a_report_nothing_is_held() -> None:
    room, _ = _room()
    assert room.room() is None
    await asyncio.wait_for(room.admit([f"t/{i}" for i in range(8)]), 1.0)
    assert room.waits == 0 and room.running() == 8


async def test_a_full_pool_holds_the_task_until_a_counted_session_is_given_back() -> None:
    room, clock = _room()
    room.report("sb-1", {FREE_SESSIONS: 1.0})
    await room.admit(["a/0"])
    assert room.room() == 0, "admitted, its session not yet reported: one less"
    waiter = asyncio.ensure_future(room.admit(["b/0"]))
    assert await _pending(waiter) and room.waits == 1
    clock.now += 1
    room.report("sb-1", {FREE_SESSIONS: 1.0})  # before a/0's session opened (lazily)
    assert await _pending(waiter), "a report before the open does not count it"
    room.opened("a/0")
    clock.now += 1
    room.report("sb-1", {FREE_SESSIONS: 0.0})  # counts a/0's session now
    assert await _pending(waiter)
    room.finished(["a/0"])  # the report counted its session: free before the next report
    await asyncio.wait_for(waiter, 1.0)


async def test_an_ended_trajectory_the_reports_never_counted_frees_nothing() -> None:
    room, clock = _room()
    room.report("sb-1", {FREE_SESSIONS: 1.0})
    await room.admit(["a/0"])
    room.opened("a/0")
    room.finished(["a/0"])  # opened and closed between two reports
    assert room.room() == 1
    clock.now += 1
    room.report("sb-1", {FREE_SESSIONS: 1.0})
    assert room.room() == 1


async def test_a_task_takes_its_sessions_at_once_and_a_large_one_goes_alone() -> None:
    room, _ = _room()
    room.report("sb-1", {FREE_SESSIONS: 2.0})
    room.report("sb-2", {FREE_SESSIONS: 1.0})
    assert room.room() == 3
    await room.admit(["s/0", "s/1"])
    big = asyncio.ensure_future(room.admit([f"b/{i}" for i in range(4)]))
    assert await _pending(big), "more than the pool has: it waits for ours to end"
    room.finished(["s/0", "s/1"])
    await asyncio.wait_for(big, 1.0)


async def test_stale_reports_lift_the_gate() -> None:
    room, clock = _room(stale_s=5.0)
    room.report("sb-1", {FREE_SESSIONS: 0.0})
    assert room.room() == 0
    clock.now += 6.0
    assert room.room() is None
    await asyncio.wait_for(room.admit(["a/0"]), 1.0)


async def test_closing_cancels_a_waiter() -> None:
    room, _ = _room()
    room.report("sb-1", {FREE_SESSIONS: 0.0})
    waiter = asyncio.ensure_future(room.admit(["a/0"]))
    assert await _pending(waiter)
    room.close()
    await asyncio.wait([waiter], timeout=1.0)
    assert waiter.cancelled()
    with pytest.raises(asyncio.CancelledError):
        await room.admit(["b/0"])
