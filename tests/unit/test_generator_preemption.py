"""Preemption decisions alone (who yields, when), and a trajectory's saved state."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from protocol.codec import Codec, encode
from protocol.messages import (
    ChatMessage,
    FailureKind,
    RolloutStatus,
    SavedTrajectory,
    Segment,
    Task,
    ToolCall,
)
from services.domains.retry import RetryPolicy
from services.generator import retries
from services.generator.agent import AgentLoop
from services.generator.scheduling.preemption import Preemption, preemptible
from services.generator.tools import ToolInfraError, ToolOutcome
from services.generator.trajectory import Trajectory
from services.model.tokens import ChatTokenizer
from services.model.tool_format import ToolCallRequest
from services.runtime.priority import PriorityGate
from tests.unit.test_generator_agent import ScriptedEngine

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


class FlakyTools:
    """Sessions whose second call fails the first time (the sandbox died), with snapshots."""

    def __init__(self) -> None:
        self.opened_from: list[str | None] = []
        self.snapshots = 0
        self.failed = False

    async def open(
        self,
        trajectory_id: str,
        allowed: tuple[str, ...],
        files: object = None,
        snapshot: str | None = None,
    ) -> FlakySession:
        self.opened_from.append(snapshot)
        return FlakySession(self)


class FlakySession:
    def __init__(self, tools: FlakyTools) -> None:
        self._tools = tools
        self._calls = 0

    async def call(self, request: ToolCallRequest) -> ToolOutcome:
        self._calls += 1
        if self._calls == 2 and not self._tools.failed:
            self._tools.failed = True
            raise ToolInfraError("sandbox died")
        return ToolOutcome(output=f"ran {self._calls}", status="ok", duration_s=0.0)

    async def snapshot(self) -> str | None:
        self._tools.snapshots += 1
        return f"snap-{self._tools.snapshots}"

    async def close(self) -> None:
        return None


async def test_a_failed_sample_is_retried_from_its_last_checkpoint(tiny_model: Path) -> None:
    tokenizer = ChatTokenizer.load(tiny_model)
    call = tokenizer.encode('<tool_call>{"name": "bash", "arguments": {"code": "x"}}</tool_call>')
    answer = tokenizer.encode("<answer>1</answer>") + list(tokenizer.eos_ids)
    engine = ScriptedEngine([call, call, call, answer])
    tools = FlakyTools()
    loop = AgentLoop(engine, tokenizer, tools)  # type: ignore[arg-type]
    outcome = await loop.run_until(TOOLS, lambda: False, checkpoints=True)
    [failed] = outcome.rollouts
    assert failed.failure is FailureKind.TOOL and list(outcome.checkpoints) == [0]
    plan = retries.plan(TOOLS, outcome.rollouts, RetryPolicy(), 0.0, outcome.checkpoints)
    assert plan.retry is not None
    [saved] = plan.retry.resume
    # Saved before the failed call, with the sandbox as the first call left it.
    assert (saved.turns, saved.snapshot, len(saved.tool_calls)) == (2, "snap-1", 1)
    [rollout] = await loop.run(plan.retry)
    assert tools.opened_from == [None, "snap-1"]
    assert rollout.id == "t/0@1" and rollout.status is RolloutStatus.OK
    assert [c.output for c in rollout.tool_calls] == ["ran 1", "ran 1", "ran 2"]
    assert len(engine.requests) == 4, "turns 1 and 2 were not generated again"


async def test_stop_ends_the_check_loop_without_a_cancellation() -> None:
    preemption = Preemption(full_gate(1), depths({}), check_s=0.01, on=True)
    loop = asyncio.create_task(preemption.run())
    await asyncio.sleep(0.03)
    preemption.stop()
    await asyncio.wait_for(loop, 1.0)  # a lost cancel must not keep a service from stopping


async def test_a_task_parked_at_admission_yields_whatever_its_kind() -> None:
    preemption = Preemption(full_gate(2), depths({0: 1}), check_s=1.0, on=True)
    running_tools = preemption.started(1, TOOLS, tier=3)
    parked = preemption.started(2, PLAIN, tier=2)
    never = asyncio.Event()
    waiting = asyncio.create_task(parked.unless_asked(never.wait()))
    await asyncio.sleep(0)
    assert parked.parked
    await preemption.check()
    # The parked task goes first: it loses nothing, the running one a save and a resume.
    assert await asyncio.wait_for(waiting, 1.0) is False
    assert parked.should_yield() and not running_tools.should_yield()
    assert not parked.parked


async def test_an_admitted_task_goes_on_and_a_closed_gate_still_cancels() -> None:
    preemption = Preemption(full_gate(1), depths({}), check_s=1.0, on=True)
    plain = preemption.started(1, PLAIN, tier=3)
    assert await plain.unless_asked(asyncio.sleep(0)) is True

    async def admitted_as_asked() -> None:
        plain.ask()

    # Admitted in the same step: it runs to its end, and a plain task cannot yield then.
    assert await plain.unless_asked(admitted_as_asked()) is True
    assert not plain.should_yield()
    assert await plain.unless_asked(asyncio.sleep(0)) is True
    gate = asyncio.Event()
    waiting = asyncio.create_task(plain.unless_asked(gate.wait()))
    await asyncio.sleep(0)
    plain.ask()
    assert await asyncio.wait_for(waiting, 1.0) is False

    async def closed() -> None:
        raise asyncio.CancelledError("admission closed")

    other = preemption.started(2, PLAIN, tier=3)
    with pytest.raises(asyncio.CancelledError):
        await other.unless_asked(closed())


def test_a_handed_back_task_is_the_same_task_under_a_new_message_id() -> None:
    task = msgspec.structs.replace(TOOLS, attempt=1, not_before=5.0)
    back = retries.handed_back(task)
    assert (back.id, back.attempt, back.resume, back.not_before) == ("t", 1, [], None)
    assert retries.requeue_msg_id(back) != retries.requeue_msg_id(task)
