"""Tool calls of the agent loop run in the real sandbox service (real Docker engine).

The engine here is the scripted test double of tests/unit/test_generator_agent.py: a
random tiny model would not write tool calls, and the point is the tool path.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from protocol.messages import ChatMessage, RolloutStatus, SamplingParams, Task
from services.generator.agent import AgentLoop
from services.generator.tools import SandboxTools, ToolInfraError
from services.model.tokens import ChatTokenizer
from services.model.tool_format import ToolCallRequest
from services.runtime.settings import RuntimeSettings
from services.sandbox.service import SandboxService
from services.sandbox.settings import Limits, SandboxSettings
from tests.integration.support import client
from tests.unit.test_generator_agent import ScriptedEngine


@pytest.fixture
async def sandbox(nats_url: str, tmp_path: Path, sandbox_image: str) -> AsyncIterator[NATS]:
    settings = SandboxSettings(
        runtime=RuntimeSettings(nats_url=nats_url, instance="gen-tools", grace_s=5),
        backend="docker",
        image=sandbox_image,
        pool_size=1,
        # AF_UNIX paths are short: keep the sockets out of pytest's long tmp paths.
        state_dir=Path(tempfile.mkdtemp(prefix="tgt-")),
        snapshot_dir=tmp_path / "snapshots",
        defaults=Limits(timeout_s=10.0, memory_mb=128, pids=64, output_bytes=65536, disk_mb=16),
    )
    async with SandboxService(settings), client(nats_url) as nc:
        yield nc


def _call(tokenizer: ChatTokenizer, code: str) -> list[int]:
    body = {"name": "python", "arguments": {"code": code}}
    return tokenizer.encode(f"<tool_call>{json.dumps(body)}</tool_call>")


async def test_one_session_per_trajectory_keeps_state_between_calls(sandbox: NATS) -> None:
    session = await SandboxTools(sandbox, timeout_s=30).open("task-1/0", ("python",))
    try:
        first = await session.call(
            ToolCallRequest(
                name="python",
                arguments={"code": "open('notes.txt', 'w').write('kept'); print('saved')"},
                raw="",
            )
        )
        second = await session.call(
            ToolCallRequest(
                name="python", arguments={"code": "print(open('notes.txt').read())"}, raw=""
            )
        )
    finally:
        await session.close()
    assert (first.status, first.output.strip()) == ("ok", "saved")
    assert (second.status, second.output.strip()) == ("ok", "kept")


async def test_agent_loop_runs_a_python_tool_call_in_the_sandbox(
    sandbox: NATS, tiny_model: Path
) -> None:
    tokenizer = ChatTokenizer.load(tiny_model)
    answer = tokenizer.encode("<answer>42</answer>") + list(tokenizer.eos_ids)
    engine = ScriptedEngine([_call(tokenizer, "print(6 * 7)"), answer])
    loop = AgentLoop(engine, tokenizer, SandboxTools(sandbox, timeout_s=30))
    task = Task(
        id="tool-task",
        domain="tools",
        prompt=[ChatMessage(role="user", content="compute 6*7 with python")],
        tools=["python"],
        max_turns=3,
        sampling=SamplingParams(max_tokens=64),
    )
    [rollout] = await loop.run(task)
    assert rollout.status is RolloutStatus.OK, rollout.error
    call = rollout.tool_calls[0]
    assert (call.name, call.status, call.output.strip()) == ("python", "ok", "42")
    observation = tokenizer.encode(tokenizer.observation(call.output))
    assert list(engine.requests[1].prompt_ids[-len(observation) :]) == observation


async def test_no_sandbox_service_is_an_infra_failure(nats_url: str, tiny_model: Path) -> None:
    tokenizer = ChatTokenizer.load(tiny_model)
    async with client(nats_url) as nc:
        tools = SandboxTools(nc, timeout_s=2)
        with pytest.raises(ToolInfraError, match="did not answer"):
            session = await tools.open("t/0", ("python",))
            await session.call(ToolCallRequest(name="python", arguments={"code": "1"}, raw=""))
        loop = AgentLoop(ScriptedEngine([_call(tokenizer, "print(1)")]), tokenizer, tools)
        task = Task(
            id="t",
            domain="tools",
            prompt=[ChatMessage(role="user", content="x")],
            tools=["python"],
            max_turns=2,
        )
        [rollout] = await loop.run(task)
    assert rollout.status is RolloutStatus.INFRA_FAILURE
    assert "sandbox" in (rollout.error or "")


async def test_a_recovery_reference_shows_what_the_sandbox_answers(sandbox: NATS) -> None:
    """The warm-up's failed call and its fix: each output in the reference is the real
    sandbox's answer to that call, error text included."""
    from services.domains.tool_use import domain

    modpow = domain("modpow", {"task": "modpow", "recovery": 1.0})
    (example,) = modpow.examples(1, seed=4)
    codes = [
        json.loads(line.removeprefix("<tool_call>").removesuffix("</tool_call>"))["arguments"]
        for line in example.reference.split("\n")[:2]
    ]
    session = await SandboxTools(sandbox, timeout_s=30).open("recovery/0", ("python",))
    try:
        answers = [
            await session.call(ToolCallRequest(name="python", arguments=code, raw=""))
            for code in codes
        ]
    finally:
        await session.close()
    assert [a.status for a in answers] == ["nonzero_exit", "ok"]
    assert tuple(a.output for a in answers) == example.tool_outputs
