"""The trace id of a task reaches the sandbox on both hops that lead there.

generator -> sandbox: the tool calls of the agent loop (SandboxOpen, SandboxExec and
SandboxClose of its session); validator -> sandbox: the unit tests of a code domain,
judged in the runtime's batch mode (a fetch of rollouts handed over at once, each sandbox
run settled later).  The sandbox side is observed as any NATS client sees it: a plain
subscription to the sandbox subjects gets a copy of every request, headers included.

Real nats-server, real services in-process; the sandbox uses its local ``subprocess``
backend (no Docker needed).  The generator's engine is the scripted test double: a
random tiny model would not write tool calls.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from protocol import headers, streams, subjects
from protocol.codec import ANY, encode
from protocol.messages import (
    ChatMessage,
    Message,
    Rollout,
    SamplingParams,
    SandboxExec,
    SandboxLimits,
    SandboxOpen,
    Task,
)
from services.domains import Domain, DomainRegistry, Problem, ValidatorSpec
from services.generator.service import GeneratorService
from services.generator.settings import GeneratorSettings
from services.model.tokens import ChatTokenizer
from services.sandbox.service import SandboxService
from services.sandbox.settings import Limits, SandboxSettings
from services.validator import ValidatorService
from tests.integration.support import client, runtime, wait_count
from tests.integration.test_validator_service import settings as validator_settings
from tests.unit.test_generator_agent import ScriptedEngine

DOMAIN = "py"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 40) == 42"]
ANSWER = "```python\ndef add(a, b):\n    return a + b\n```"


class _One:
    def draw(self, rng: random.Random) -> Problem:
        return Problem(key="k", question="q", metadata={"tests": TESTS})


def code_domain() -> DomainRegistry:
    """One domain judged by unit tests in the sandbox."""
    code = ValidatorSpec(kind="code", name="unit_tests")
    limits = SandboxLimits(timeout_s=5.0, memory_mb=256)
    return DomainRegistry([Domain(name=DOMAIN, source=_One(), validators=(code,), sandbox=limits)])


@dataclass
class Seen:
    """Every request sent to the sandbox service, as (subject, trace id, message)."""

    requests: list[tuple[str, str, Message]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_msg(self, msg: Msg) -> None:
        trace = (msg.headers or {}).get(headers.TRACE_ID, "")
        self.requests.append((msg.subject, trace, ANY.decode(msg.data)))
        self.changed.set()

    def execs(self) -> dict[str, tuple[str, str]]:
        """SandboxExec id -> (subject, trace id)."""
        return {m.id: (s, t) for s, t, m in self.requests if isinstance(m, SandboxExec)}


@pytest.fixture
async def sandbox(nats_url: str, tmp_path: Path) -> AsyncIterator[SandboxService]:
    settings = SandboxSettings(
        runtime=runtime(nats_url, instance="trace-sbx"),
        backend="subprocess",
        pool_size=2,
        # AF_UNIX paths are short: keep the sockets out of pytest's long tmp paths.
        state_dir=Path(tempfile.mkdtemp(prefix="ttr-")),
        snapshot_dir=tmp_path / "snapshots",
        defaults=Limits(timeout_s=5.0, memory_mb=256, pids=64, output_bytes=65536, disk_mb=16),
    )
    service = SandboxService(settings)
    async with service:
        yield service


@pytest.fixture
async def seen(nats_url: str, sandbox: SandboxService) -> AsyncIterator[Seen]:
    found = Seen()
    async with client(nats_url) as nc:
        await nc.subscribe(f"{subjects.PREFIX}.sandbox.>", cb=found.on_msg)
        await nc.flush()
        yield found


def validator(url: str) -> ValidatorService:
    return ValidatorService(
        validator_settings(url, sandbox_timeout_s=5.0, sandbox_grace_s=5.0),
        domains=code_domain(),
    )


def tool_call(tokenizer: ChatTokenizer, code: str) -> list[int]:
    body = {"name": "python", "arguments": {"code": code}}
    return tokenizer.encode(f"<tool_call>{json.dumps(body)}</tool_call>")


async def publish(nc: NATS, subject: str, message: Message, trace: str, msg_id: str) -> None:
    hdrs = {headers.TRACE_ID: trace, headers.MSG_ID: msg_id}
    await nc.jetstream().publish(subject, encode(message), headers=hdrs)


async def test_the_task_trace_reaches_the_sandbox_from_generator_and_validator(
    nats_url: str, tiny_model: Path, seen: Seen
) -> None:
    tokenizer = ChatTokenizer.load(tiny_model)
    answer = tokenizer.encode(ANSWER) + list(tokenizer.eos_ids)
    engine = ScriptedEngine([tool_call(tokenizer, "print(6 * 7)"), answer])
    settings = GeneratorSettings(
        runtime=runtime(nats_url, instance="trace-gen"),
        model=tiny_model,
        tools="sandbox",
        tool_timeout_s=20.0,
        check_domains=False,
        fetch_wait_s=0.1,
    )
    task = Task(
        id="traced",
        domain=DOMAIN,
        prompt=[ChatMessage(role="user", content="write add, try python first")],
        tools=["python"],
        max_turns=3,
        sampling=SamplingParams(max_tokens=64),
        metadata={"tests": TESTS},
    )
    async with (
        client(nats_url) as nc,
        GeneratorService(settings, engine=engine),
        validator(nats_url),
    ):
        await publish(nc, subjects.task(task.tier, DOMAIN), task, "trace-of-task", task.id)
        await wait_count(nc.jetstream(), streams.SCORED.name, 1, timeout_s=60)

    instance = subjects.sandbox_instance("trace-sbx")
    kinds = {(subject, type(message).__name__) for subject, _, message in seen.requests}
    assert (subjects.sandbox_session(), "SandboxOpen") in kinds  # generator: its session
    assert (instance, "SandboxExec") in kinds  # generator: the tool call
    assert (subjects.sandbox_exec(), "SandboxExec") in kinds  # validator: the unit tests
    untraced = [(s, type(m).__name__, t) for s, t, m in seen.requests if t != "trace-of-task"]
    assert untraced == [], "sandbox requests without the task's trace id"


async def test_each_rollout_of_a_batch_carries_its_own_trace_to_the_sandbox(
    nats_url: str, seen: Seen
) -> None:
    rollouts = [
        Rollout(
            id=f"batch-{i}/0",
            task=Task(
                id=f"batch-{i}",
                domain=DOMAIN,
                prompt=[ChatMessage(role="user", content="q")],
                metadata={"tests": TESTS},
            ),
            sample_index=0,
            completion_text=ANSWER,
        )
        for i in range(6)
    ]
    async with client(nats_url) as nc:
        # All stored before the validator starts: its first fetch takes them as one batch.
        for i, rollout in enumerate(rollouts):
            await publish(nc, subjects.rollout(DOMAIN), rollout, f"trace-{i}", rollout.id)
        async with validator(nats_url):
            await wait_count(nc.jetstream(), streams.SCORED.name, len(rollouts), timeout_s=60)

    execs = seen.execs()
    for i, rollout in enumerate(rollouts):
        assert execs[f"validate-{rollout.id}"] == (subjects.sandbox_exec(), f"trace-{i}")
    assert not any(isinstance(m, SandboxOpen) for _, _, m in seen.requests)
