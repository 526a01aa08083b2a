"""Preemption at a turn boundary, over a real nats-server, a real sandbox service
(Docker) and the torch engine.

- Identity: under greedy sampling a trajectory preempted after its first tool call,
  saved through the wire format and resumed by another agent loop (its sandbox restored
  from the snapshot), ends in exactly the tokens of an uninterrupted run.  The policy is
  the tiny model warmed up to call the python tool.
- The resumed session finds the files its sandbox left (a scripted engine: the point is
  the sandbox's state, not the model's).
- In the generator service, a tier-0 task waiting behind a full generator takes the slot
  of a running tier-3 multi-turn task, which is re-queued with its state and finishes
  later with every turn; with preemption off the tier-0 task waits its turn.  The engine
  is a test double at the model boundary that calls a tool for a fixed number of turns.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import msgspec
import numpy as np
import pytest
from nats.aio.client import Client as NATS

from protocol import streams
from protocol.codec import Codec, encode
from protocol.messages import ChatMessage, FinishReason, RolloutStatus, SamplingParams, Task
from services.domains import tool_use
from services.engines.engine import GenerateRequest, Sample
from services.engines.torch.engine import TorchEngine
from services.generator import retries
from services.generator.agent import AgentLoop
from services.generator.service import GeneratorService
from services.generator.tools import SandboxTools
from services.model.tokens import ChatTokenizer
from services.runtime.jetstream import ensure_streams
from services.sandbox.service import SandboxService
from tests.engines import ScriptedTurns, occurrences, stopped
from tests.integration import test_generator_service
from tests.integration.test_generator_scheduling import _sandbox_settings
from tests.integration.test_generator_service import RolloutTap, _settings, _submit
from tests.unit.test_generator_agent import ScriptedEngine

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

nc = test_generator_service.nc
tap = test_generator_service.tap


def _greedy(task: Task) -> Task:
    sampling = msgspec.structs.replace(task.sampling, temperature=0.0, max_tokens=96)
    return msgspec.structs.replace(task, sampling=sampling, n=1, max_turns=4)


def _second_boundary() -> object:
    """Yield at the second turn boundary: after the first tool call ran."""
    checks = itertools.count()
    return lambda: next(checks) == 1


async def test_a_preempted_trajectory_resumes_to_the_tokens_of_an_uninterrupted_run(
    nats_url: str, nc: NATS, calling_policy: Path, sandbox_image: str, tmp_path: Path
) -> None:
    engine = TorchEngine(calling_policy)
    await engine.start()
    tokenizer = ChatTokenizer.load(calling_policy)
    # The puzzles the policy was warmed up on (bench/bench_scheduling.py): modpow only.
    domain = tool_use.domain("tool_use", {"task": "modpow"})
    tasks = [_greedy(t) for t in domain.make_tasks(8, "eval", 0)]
    try:
        async with SandboxService(_sandbox_settings(nats_url, sandbox_image, tmp_path)):
            loop = AgentLoop(engine, tokenizer, SandboxTools(nc, timeout_s=30))
            whole = [(await loop.run(task))[0] for task in tasks]
            chosen = [(t, r) for t, r in zip(tasks, whole, strict=True) if len(r.tool_calls) >= 2]
            assert chosen, [len(r.tool_calls) for r in whole]
            task, reference = chosen[0]
            first = await loop.run_until(task, _second_boundary())  # type: ignore[arg-type]
            [suspended] = first.suspended
            assert first.rollouts == [] and suspended.snapshot is not None
            # Through the wire, to a loop that shares nothing with the first but the engine.
            wire = encode(retries.resumed(task, [suspended.saved()]))
            resumed = Codec(Task).decode(wire)
            other = AgentLoop(engine, tokenizer, SandboxTools(nc, timeout_s=30))
            [rollout] = await other.run(resumed)
    finally:
        await engine.close()
    assert rollout.id == reference.id and rollout.status is RolloutStatus.OK
    assert rollout.token_ids.tolist() == reference.token_ids.tolist()
    assert rollout.loss_mask == reference.loss_mask
    np.testing.assert_allclose(rollout.behaviour_logprobs, reference.behaviour_logprobs, atol=1e-4)
    assert [c.output for c in rollout.tool_calls] == [c.output for c in reference.tool_calls]
    assert [s.kind for s in rollout.segments] == [s.kind for s in reference.segments]


def _bash(tokenizer: ChatTokenizer, code: str) -> list[int]:
    body = {"name": "bash", "arguments": {"code": code}}
    return tokenizer.encode(f"<tool_call>{json.dumps(body)}</tool_call>")


async def test_a_resumed_session_finds_the_files_its_sandbox_left(
    nats_url: str, nc: NATS, tiny_model: Path, sandbox_image: str, tmp_path: Path
) -> None:
    tokenizer = ChatTokenizer.load(tiny_model)
    answer = tokenizer.encode("<answer>done</answer>") + list(tokenizer.eos_ids)
    engine = ScriptedEngine(
        [_bash(tokenizer, "echo kept > note.txt"), _bash(tokenizer, "cat note.txt"), answer]
    )
    task = Task(
        id="notes",
        domain="shell",
        prompt=[ChatMessage(role="user", content="Keep a note.")],
        tools=["bash"],
        max_turns=4,
        sampling=SamplingParams(max_tokens=64),
    )
    async with SandboxService(_sandbox_settings(nats_url, sandbox_image, tmp_path)):
        loop = AgentLoop(engine, tokenizer, SandboxTools(nc, timeout_s=30))
        first = await loop.run_until(task, _second_boundary())  # type: ignore[arg-type]
        [suspended] = first.suspended
        again = AgentLoop(engine, tokenizer, SandboxTools(nc, timeout_s=30))
        [rollout] = await again.run(retries.resumed(task, [suspended.saved()]))
    assert [c.output.strip() for c in rollout.tool_calls] == ["", "kept"]
    assert rollout.finish_reason is FinishReason.STOP and rollout.status is RolloutStatus.OK


class TurnTaker(ScriptedTurns):
    """Test double at the model boundary: calls the echo tool until its trajectory holds
    ``calls`` tool calls, then answers; each turn takes ``turn_s``."""

    name = "turn-taker"

    def __init__(self, tokenizer: ChatTokenizer, *, calls: int, turn_s: float) -> None:
        body = {"name": "echo", "arguments": {"x": 1}}
        self._call = tokenizer.encode(f"<tool_call>{json.dumps(body)}</tool_call>")
        self._answer = tokenizer.encode("<answer>1</answer>") + list(tokenizer.eos_ids)
        self._calls = calls
        self._turn_s = turn_s

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        await asyncio.sleep(self._turn_s)
        made = occurrences(request.prompt_ids, self._call)
        return stopped(self._call if made < self._calls else self._answer, request.n)


def _tiered(task_id: str, tier: int, *, tools: bool, tenant: str = "") -> Task:
    return Task(
        id=task_id,
        domain="steps",
        tenant=tenant,
        tier=tier,
        prompt=[ChatMessage(role="user", content=f"Work on {task_id}.")],
        tools=["echo"] if tools else [],
        max_turns=10 if tools else 1,
        sampling=SamplingParams(max_tokens=64),
    )


@pytest.mark.parametrize("preemption", [True, False])
async def test_high_tier_work_takes_the_slot_of_a_running_low_tier_task(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path, preemption: bool
) -> None:
    js = nc.jetstream()
    await ensure_streams(js, streams.ALL)
    settings = _settings(
        nats_url, tiny_model, max_concurrent_tasks=1, preemption=preemption, preempt_check_s=0.05
    )
    engine = TurnTaker(ChatTokenizer.load(tiny_model), calls=6, turn_s=0.3)
    async with GeneratorService(settings, engine) as service:
        # A named tenant's task: re-queued on its tenant's subject, else refused there.
        await _submit(js, _tiered("long", 3, tools=True, tenant="acme"))
        async with asyncio.timeout(30):
            while not service.preemption.running():
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.4)  # into its turns
        await _submit(js, _tiered("urgent", 0, tools=False))
        await tap.wait(2, timeout_s=60)
        stats = service.statistics()
    order = [r.task.id for r in tap.got]
    [long] = [r for r in tap.got if r.task.id == "long"]
    assert long.status is RolloutStatus.OK and long.finish_reason is FinishReason.STOP
    assert [c.turn for c in long.tool_calls] == list(range(6)), "every turn, once"
    assert long.id == "long/0" and long.task.tenant == "acme"
    if preemption:
        assert order == ["urgent", "long"]
        assert stats["preemptions"] >= 1 and stats["resumes"] >= 1
        assert long.task.preemptions >= 1 and long.task.resume == [], "state not carried on"
    else:
        assert order == ["long", "urgent"]
        assert stats["preemptions"] == 0


async def test_a_heldout_task_takes_the_slot_of_a_task_parked_at_staleness_admission(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path
) -> None:
    """No learner trains: once one sample is admitted, the next training task waits at
    admission for ever, holding the only slot; the held-out task above it still runs."""
    js = nc.jetstream()
    await ensure_streams(js, streams.ALL)
    settings = _settings(
        nats_url, tiny_model, max_concurrent_tasks=1, admission_samples=1, preempt_check_s=0.05
    )
    engine = TurnTaker(ChatTokenizer.load(tiny_model), calls=0, turn_s=0.05)
    async with GeneratorService(settings, engine) as service:
        await _submit(js, _tiered("first", 2, tools=False))
        await tap.wait(1, timeout_s=30)
        await _submit(js, _tiered("parked", 2, tools=False))
        async with asyncio.timeout(30):
            while service.admission.waits < 1:
                await asyncio.sleep(0.02)
        heldout = msgspec.structs.replace(
            _tiered("eval", 0, tools=False), metadata={"split": "eval"}
        )
        await _submit(js, heldout)
        await tap.wait(2, timeout_s=30)
        stats = service.statistics()
        info = await js.stream_info(streams.TASK_STREAMS[2].name)
    assert [r.task.id for r in tap.got] == ["first", "eval"]
    assert stats["preemptions_parked"] >= 1
    assert info.state.messages == 1, "the parked task is back in its stream, not lost"
