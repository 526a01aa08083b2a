"""Preemption decisions alone (who yields, when), and a trajectory's saved state."""

from __future__ import annotations

import msgspec
import pytest

from protocol.codec import Codec, encode
from protocol.messages import ChatMessage, SavedTrajectory, Segment, Task, ToolCall
from services.generator import retries
from services.generator.preemption import Preemption, preemptible
from services.generator.trajectory import Trajectory
from services.runtime.priority import PriorityGate

TOOLS = Task(
    id="t", domain="d", prompt=[ChatMessage(role="user", content="q")], tools=["bash"], max_turns=4
)
PLAIN = msgspec.structs.replace(TOOLS, tools=[], max_turns=1)


def full_gate(slots: int) -> PriorityGate:
    gate = PriorityGate(4, slots)
    for tier in range(4):
        gate.fetched(tier, slots if tier == 3 else 0)
    return gate


def depths(values: dict[int, int]):  # type: ignore[no-untyped-def]
    async def depth(tier: int) -> int:
        return values.get(tier, 0)

    return depth


async def test_waiting_high_tier_work_asks_the_latest_lowest_tier_task_to_yield() -> None:
    preemption = Preemption(full_gate(3), depths({0: 1}), check_s=1.0, on=True)
    older = preemption.started(1, TOOLS, tier=3)
    middle = preemption.started(2, TOOLS, tier=2)
    newest = preemption.started(3, TOOLS, tier=3)
    await preemption.check()
    assert (older.should_yield(), middle.should_yield(), newest.should_yield()) == (
        False,
        False,
        True,
    )
    await preemption.check()  # the one waiting task is covered: nobody else yields
    assert preemption.asked == 1 and not older.should_yield()


async def test_nobody_yields_with_a_free_slot_or_nothing_preemptible() -> None:
    free = PriorityGate(4, 3)
    preemption = Preemption(free, depths({0: 5}), check_s=1.0, on=True)
    running = preemption.started(1, TOOLS, tier=3)
    await preemption.check()
    assert not running.should_yield()
    single = Preemption(full_gate(1), depths({0: 5}), check_s=1.0, on=True)
    plain = single.started(1, PLAIN, tier=3)
    await single.check()
    assert not plain.should_yield() and not preemptible(PLAIN) and preemptible(TOOLS)


async def test_work_in_flight_here_is_not_counted_as_waiting() -> None:
    preemption = Preemption(full_gate(2), depths({1: 1}), check_s=1.0, on=True)
    preemption.started(1, PLAIN, tier=1)  # the tier-1 task in the stream is this one
    low = preemption.started(2, TOOLS, tier=3)
    await preemption.check()
    assert not low.should_yield()


def test_a_trajectory_survives_saving_through_the_wire() -> None:
    trajectory = Trajectory(
        index=1,
        prompt=[1, 2],
        completion=[5, 6, 7],
        logprobs=[-0.25, 0.0, -1.5],
        mask=[1, 0, 1],
        segments=[Segment(start=0, end=1, version=3), Segment(start=1, end=2, kind="tool")],
        tool_calls=[ToolCall(turn=0, name="bash", arguments="{}", output="x")],
        turns=2,
        cached_tokens=4,
        generate_s=0.5,
        tool_s=0.25,
    )
    trajectory.suspend("snap-1", save_s=0.1)
    task = retries.resumed(msgspec.structs.replace(TOOLS, n=2), [trajectory.saved()])
    back = Codec(Task).decode(encode(task))
    assert (back.samples, back.preemptions) == ([1], 1)
    restored = Trajectory.restored(back.resume[0], [1, 2])
    for name in ("completion", "logprobs", "mask", "segments", "tool_calls", "turns"):
        assert getattr(restored, name) == getattr(trajectory, name), name
    assert restored.snapshot == "snap-1" and not restored.suspended


def test_saved_arrays_must_agree() -> None:
    with pytest.raises(ValueError, match="one entry per completion token"):
        SavedTrajectory(sample_index=0, completion=b"\0" * 8, logprobs=b"\0" * 4, loss_mask=b"\1")
