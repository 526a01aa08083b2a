"""Admission by staleness: what is started stays within the budget ahead of the learner."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from protocol.messages import ChatMessage, SavedTrajectory, Task
from services.generator.scheduling.admission import StalenessAdmission
from services.generator.service import _admitted_samples


async def test_tasks_wait_until_the_learner_has_consumed_enough() -> None:
    gate = StalenessAdmission(budget=16)
    await gate.admit(8)
    await gate.admit(8)
    waiting = asyncio.ensure_future(gate.admit(8))
    await asyncio.sleep(0.01)
    assert not waiting.done() and gate.waits == 1 and gate.ahead() == 16
    gate.learner_trained(4)  # 12 ahead: 8 more would be 20 > 16
    await asyncio.sleep(0.01)
    assert not waiting.done()
    gate.learner_trained(8)
    await asyncio.wait_for(waiting, 1.0)
    assert gate.started == 24 and gate.ahead() == 16


async def test_a_restarted_generator_does_not_count_what_was_trained_as_room() -> None:
    gate = StalenessAdmission(budget=16)
    gate.learner_trained(1000)  # learned from the first PolicyUpdate after a restart
    await gate.admit(16)
    assert not gate.allows(1) and gate.ahead() == 16
    gate.learner_trained(999)  # an older announcement changes nothing
    assert gate.trained == 1000


async def test_no_budget_admits_everything_and_a_large_task_goes_alone() -> None:
    free = StalenessAdmission(budget=0)
    for _ in range(10):
        await free.admit(100)
    assert free.waits == 0
    small = StalenessAdmission(budget=4)
    await asyncio.wait_for(small.admit(8), 1.0)  # nothing ahead: it goes, alone
    assert not small.allows(1)


async def test_closing_cancels_the_waiters_and_refuses_new_ones() -> None:
    gate = StalenessAdmission(budget=4)
    await gate.admit(4)
    waiting = asyncio.ensure_future(gate.admit(2))
    await asyncio.sleep(0.01)
    gate.close()
    await asyncio.wait([waiting], timeout=1.0)
    assert waiting.cancelled()
    with pytest.raises(asyncio.CancelledError):
        await gate.admit(2)
    assert gate.ahead() == 4, "nothing handed back counts as started"
    await asyncio.wait_for(gate.admit(0), 1.0)  # what fits still goes


async def test_a_call_waits_for_room_but_reserves_none() -> None:
    admission = StalenessAdmission(budget=4)
    await admission.admit(4)
    waiting = asyncio.ensure_future(admission.admit(2, reserve=False))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # no room: it waits like any task
    admission.learner_trained(2)
    await asyncio.wait_for(waiting, 1)
    assert admission.ahead() == 2  # what it waited for was not counted as started


def test_resumed_and_retried_samples_are_not_reserved_twice() -> None:
    """A preempted sample goes on in a new task, a failed one is retried in one: both
    were reserved when their task first started.  Reserving them again would leave the
    budget full once the learner has trained them, and stall the run."""
    prompt = [ChatMessage(role="user", content="2^10 mod 7?")]
    task = Task(id="t", domain="modpow", prompt=prompt, n=4)
    assert _admitted_samples(task) == (4, True)
    saved = [SavedTrajectory(sample_index=1)]
    resumed = msgspec.structs.replace(task, samples=[1], resume=saved, preemptions=1)
    assert _admitted_samples(resumed) == (0, True)
    assert _admitted_samples(msgspec.structs.replace(task, samples=[2], attempt=1)) == (0, True)
    # Handed back before it started (no saved state): its reservation was never made.
    assert _admitted_samples(msgspec.structs.replace(task, preemptions=1)) == (4, True)
