"""Retries of failed samples in the generator service, over a real nats-server, a real
sandbox service (Docker) and the torch engine.

A sample whose sandbox fails goes again as a new attempt of its task, with ids that
include the attempt (never swallowed by dedup) and the task's id (the GRPO group it
belongs to); a redelivery of the same attempt stays deduplicated; samples that fail on
their last attempt are dead-lettered, and ``temper dlq retry`` starts the next one.

The tool-calling engine is the test double of test_generator_scheduling (a random tiny
model writes no tool calls); the deduplication test uses the real torch engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client as NATS

from protocol import streams, subjects
from protocol.codec import Codec, encode
from protocol.errors import ErrorCode
from protocol.messages import ChatMessage, FailureKind, RolloutStatus, SamplingParams, Task
from services.cli import dlq
from services.engines.engine import GenerateRequest, Sample
from services.generator.service import GeneratorService
from services.model.tokens import ChatTokenizer
from services.runtime.jetstream import ensure_streams
from services.sandbox.service import SandboxService
from tests.engines import ScriptedTurns, occurrences, stopped
from tests.integration import test_generator_service
from tests.integration.test_generator_scheduling import ToolCaller, _sandbox_settings
from tests.integration.test_generator_service import RolloutTap, _settings, _submit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

nc = test_generator_service.nc
tap = test_generator_service.tap


def _task(task_id: str, *, n: int = 2, tools: tuple[str, ...] = ("python",)) -> Task:
    return Task(
        id=task_id,
        domain="boxed",
        tier=1,
        prompt=[ChatMessage(role="user", content=f"Compute {task_id}.")],
        sampling=SamplingParams(max_tokens=4, seed=3),
        tools=list(tools),
        max_turns=2,
        n=n,
    )


async def _until(check: object, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.05)


async def test_failed_samples_go_again_with_new_ids_in_their_group(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path, sandbox_image: str, tmp_path: Path
) -> None:
    settings = _settings(
        nats_url, tiny_model, tools="sandbox", tool_timeout_s=10.0, retry_max_attempts=6
    )
    engine = ToolCaller(ChatTokenizer.load(tiny_model))
    async with GeneratorService(settings, engine) as service:
        # No sandbox service yet: both samples' tool calls fail on the infrastructure.  A
        # named tenant's task: its retry goes on its tenant's subject, else it is refused.
        await _submit(nc.jetstream(), msgspec.structs.replace(_task("flaky"), tenant="acme"))
        await _until(lambda: service.outcomes.retried >= 2, timeout_s=30)
        retry_published = time.time()
        assert tap.got == [], "a sample that goes again is not published as failed"
        async with SandboxService(_sandbox_settings(nats_url, sandbox_image, tmp_path)):
            rollouts = await tap.wait(2, timeout_s=90)
    assert {r.status for r in rollouts} == {RolloutStatus.OK}, [r.error for r in rollouts]
    attempts = {r.task.attempt for r in rollouts}
    assert min(attempts) >= 1
    assert sorted(r.id for r in rollouts) == sorted(
        f"flaky/{r.sample_index}@{r.task.attempt}" for r in rollouts
    )
    assert {r.task.id for r in rollouts} == {"flaky"}, "the retry keeps its GRPO group"
    assert {r.task.tenant for r in rollouts} == {"acme"}
    assert sorted(r.sample_index for r in rollouts) == [0, 1]
    # The first retry waits out its backoff (1 s) before it starts.
    assert min(r.created_at or 0.0 for r in rollouts) >= retry_published + 0.5


async def test_a_redelivered_attempt_is_deduplicated_and_a_new_attempt_is_not(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path
) -> None:
    js = nc.jetstream()
    await ensure_streams(js, streams.ALL)
    base = _task("dedup", tools=())
    retry = Task(**{**_fields(base), "attempt": 1, "samples": [1]})
    third = Task(**{**_fields(base), "attempt": 2, "samples": [1]})
    published = ((base, "dedup"), (retry, "dedup@1"), (retry, "dedup@1-again"))
    published += ((base, "dedup-again"), (third, "dedup@2"))
    async with GeneratorService(_settings(nats_url, tiny_model)):
        for task, msg_id in published:
            # Distinct message ids: the task stream keeps each, as if redelivered.
            await js.publish(
                subjects.task(1, "boxed"), encode(task), headers={"Nats-Msg-Id": msg_id}
            )
        # The tap sees every publish; the rollout stream stores each id once.
        await tap.wait(7, timeout_s=60)
    stored = await js.stream_info(streams.ROLLOUTS.name)
    ids = sorted({r.id for r in tap.got})
    assert ids == ["dedup/0", "dedup/1", "dedup/1@1", "dedup/1@2"]
    assert stored.state.messages == 4


async def test_samples_failing_on_their_last_attempt_are_dead_lettered_then_retried(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path, sandbox_image: str, tmp_path: Path
) -> None:
    settings = _settings(
        nats_url,
        tiny_model,
        tools="sandbox",
        tool_timeout_s=10.0,
        retry_max_attempts=2,
        retry_backoff_s=0.2,
    )
    engine = ToolCaller(ChatTokenizer.load(tiny_model))
    js = nc.jetstream()
    async with GeneratorService(settings, engine) as service:
        await _submit(js, _task("doomed"))
        failed = list(await tap.wait(2, timeout_s=60))
        await _until(lambda: service.outcomes.exhausted >= 2, timeout_s=10)
        [letter] = [m async for m in dlq.entries(js)]
        async with SandboxService(_sandbox_settings(nats_url, sandbox_image, tmp_path)):
            await dlq.retry_one(js, letter)
            retried = (await tap.wait(4, timeout_s=90))[2:]
    assert sorted(r.id for r in failed) == ["doomed/0@1", "doomed/1@1"]
    assert {(r.status, r.failure) for r in failed} == {
        (RolloutStatus.INFRA_FAILURE, FailureKind.TOOL)
    }
    headers = letter.headers or {}
    assert headers["Temper-Dlq-Code"] == ErrorCode.RETRIES_EXHAUSTED.value
    assert "attempt 2 of 2" in headers["Temper-Dlq-Reason"]
    dead = Codec(Task).decode(letter.data or b"")
    assert (dead.id, dead.attempt, dead.samples) == ("doomed", 1, [0, 1])
    assert sorted(r.id for r in retried) == ["doomed/0@2", "doomed/1@2"]
    assert {r.status for r in retried} == {RolloutStatus.OK}
    assert [m async for m in dlq.entries(js)] == [], "the retried dead letter is gone"


class TwoSteps(ScriptedTurns):
    """Test double at the model boundary: writes a note, reads it back, answers.  Before
    the read it waits for ``proceed`` (the test stops the sandbox service meanwhile)."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.steps = [_bash(tokenizer, "echo kept > note.txt"), _bash(tokenizer, "cat note.txt")]
        self.answer = tokenizer.encode("<answer>kept</answer>") + list(tokenizer.eos_ids)
        self.first_turns = 0
        self.at_read = asyncio.Event()
        self.proceed = asyncio.Event()

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        made = sum(occurrences(request.prompt_ids, step) for step in self.steps)
        if made == 0:
            self.first_turns += 1
        if made == 1:
            self.at_read.set()
            await self.proceed.wait()
        ids = self.steps[made] if made < len(self.steps) else self.answer
        return stopped(ids, request.n)


def _bash(tokenizer: ChatTokenizer, code: str) -> list[int]:
    body = {"name": "bash", "arguments": {"code": code}}
    return tokenizer.encode(f"<tool_call>{json.dumps(body)}</tool_call>")


async def test_a_multi_turn_retry_goes_on_from_its_last_checkpoint(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path, sandbox_image: str, tmp_path: Path
) -> None:
    settings = _settings(
        nats_url, tiny_model, tools="sandbox", tool_timeout_s=10.0, retry_backoff_s=0.2
    )
    engine = TwoSteps(ChatTokenizer.load(tiny_model))
    task = msgspec.structs.replace(_task("notes", n=1, tools=("bash",)), max_turns=4)
    sandbox = _sandbox_settings(nats_url, sandbox_image, tmp_path)
    async with GeneratorService(settings, engine) as service:
        async with SandboxService(sandbox):
            await _submit(nc.jetstream(), task)
            await asyncio.wait_for(engine.at_read.wait(), timeout=60)
        # The sandbox is gone when the read runs: a tool failure, retried.
        engine.proceed.set()
        await _until(lambda: service.outcomes.retried >= 1, timeout_s=30)
        # Another sandbox instance, sharing the snapshot directory.
        async with SandboxService(sandbox):
            [rollout] = await tap.wait(1, timeout_s=90)
    assert rollout.id == "notes/0@1" and rollout.status is RolloutStatus.OK, rollout.error
    assert [c.output.strip() for c in rollout.tool_calls] == ["", "kept"]
    assert engine.first_turns == 1, "the retry went on from its checkpoint, not the prompt"


def _fields(task: Task) -> dict[str, object]:
    return {name: getattr(task, name) for name in task.__struct_fields__}
