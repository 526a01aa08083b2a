"""The terminal family end to end: every template judged by the real validator, replaying
commands in sessions of the real sandbox service (Docker, the offline sandbox image).

For each template the reference solution scores 1.0, and the untouched setup scores
less with the failed check named.  All rollouts go out at once, so the whole file runs
in well under a minute.  Skips without Docker, unless CI=true or TEMPER_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from protocol import streams
from protocol.codec import Codec
from protocol.messages import Rollout, ScoredRollout, ScoreStatus, Task, ToolCall
from services.domains import DomainRegistry
from services.domains.terminal.base import Made
from services.domains.terminal.family import TEMPLATES, domain, problem
from services.generator.agent import AgentLoop
from services.generator.tools import SandboxTools, WorkspaceUnsaved
from services.model.tokens import ChatTokenizer
from services.model.tool_format import ToolCallRequest
from services.runtime.settings import RuntimeSettings
from services.sandbox.service import SandboxService
from services.sandbox.settings import Limits, SandboxSettings
from services.validator import ValidatorService
from tests.integration.support import client, stream_entries, wait_count
from tests.integration.test_validator_sandbox import wait_warm
from tests.integration.test_validator_service import publish, settings
from tests.unit.test_generator_agent import ScriptedEngine

SCORED: Codec[ScoredRollout] = Codec(ScoredRollout)
TERMINAL = domain("terminal", {})


def sandbox_settings(url: str, image: str, tmp: Path) -> SandboxSettings:
    return SandboxSettings(
        runtime=RuntimeSettings(nats_url=url, heartbeat_s=0.2, grace_s=0.2, instance="sbx-term"),
        backend="docker",
        image=image,
        pool_size=4,
        # AF_UNIX paths are short: keep the sockets out of pytest's long tmp paths.
        state_dir=Path(tempfile.mkdtemp(prefix="tvt-")),
        snapshot_dir=tmp / "snapshots",
        # g++ and node run in the bash sessions: room for them.
        defaults=Limits(timeout_s=20.0, memory_mb=512, pids=128, output_bytes=65536, disk_mb=64),
    )


@contextlib.asynccontextmanager
async def terminal_stack(
    nats_url: str, tmp_path: Path, image: str, *, timeout_s: float
) -> AsyncIterator[NATS]:
    """The sandbox service, warm, and a validator of the terminal family; a connection."""
    sandbox = SandboxService(sandbox_settings(nats_url, image, tmp_path))
    # A few rollouts at a time: each holds a sandbox of the pool for its whole replay.
    validator = ValidatorService(
        settings(nats_url, sandbox_timeout_s=timeout_s, sandbox_grace_s=timeout_s, max_in_flight=4),
        domains=DomainRegistry([TERMINAL]),
    )
    async with sandbox, validator, client(nats_url) as nc:
        await wait_warm(sandbox, 4)
        yield nc


@pytest.fixture
async def stack(nats_url: str, tmp_path: Path, sandbox_image: str) -> AsyncIterator[NATS]:
    async with terminal_stack(nats_url, tmp_path, sandbox_image, timeout_s=30.0) as nc:
        yield nc


def made(name: str, seed: int = 7) -> Made:
    return TEMPLATES[name](random.Random(f"{name}:{seed}"))


def task_of(name: str, label: str, index: int) -> Task:
    task = TERMINAL.task(problem(name, made(name)), "train", 0, index)
    return msgspec.structs.replace(task, id=f"term-{label}-{index}")


def bash_call(turn: int, command: str) -> ToolCall:
    body = json.dumps({"name": "bash", "arguments": {"code": command}})
    return ToolCall(turn=turn, name="bash", arguments=body, status="ok")


def rollout(task: Task, commands: tuple[str, ...]) -> Rollout:
    calls = [bash_call(turn, command) for turn, command in enumerate(commands)]
    return Rollout(
        id=f"{task.id}/0", task=task, sample_index=0, completion_text="Done.", tool_calls=calls
    )


async def live(nc: NATS, task: Task, commands: tuple[str, ...]) -> Rollout:
    """The rollout of a trajectory whose bash calls are ``commands``, as the generator
    makes it: run in one real session, outputs recorded, snapshotted at the end."""
    files = {p: t.encode() for p, t in task.metadata["sandbox_files"].items()}
    session = await SandboxTools(nc, timeout_s=90).open(f"{task.id}/0", ("bash",), files)
    calls: list[ToolCall] = []
    snapshot, error = None, None
    try:
        for turn, command in enumerate(commands):
            body = json.dumps({"name": "bash", "arguments": {"code": command}})
            request = ToolCallRequest(name="bash", arguments={"code": command}, raw=body)
            outcome = await session.call(request)
            call = ToolCall(turn=turn, name="bash", arguments=body, output=outcome.output)
            calls.append(msgspec.structs.replace(call, status=outcome.status))
        snapshot = await session.snapshot()
    except WorkspaceUnsaved as unsaved:  # as the generator records it; infra would raise
        error = str(unsaved)
    finally:
        await session.close()
    base = rollout(task, ())
    return msgspec.structs.replace(base, tool_calls=calls, snapshot=snapshot, snapshot_error=error)


async def score_all(js: JetStreamContext, rollouts: list[Rollout]) -> dict[str, ScoredRollout]:
    for item in rollouts:
        await publish(js, item)
    await wait_count(js, streams.SCORED.name, len(rollouts), timeout_s=120)
    scored = [SCORED.decode(e.data) for e in await stream_entries(js, streams.SCORED.name)]
    return {s.rollout.task.id: s for s in scored}


async def test_every_template_solved_scores_one_and_untouched_scores_less(stack: NATS) -> None:
    names = sorted(TEMPLATES)
    solved = [rollout(task_of(n, "solved", i), made(n).solution) for i, n in enumerate(names)]
    untouched = [rollout(task_of(n, "untouched", i), ()) for i, n in enumerate(names)]
    wrong = rollout(task_of("count_errors", "wrong", 0), ("echo 0 > error_count.txt",))
    # The docs' worked example: run without chmod, after a failed try; half the checks.
    half = rollout(
        task_of("executable_script", "half", 0), ("./tools/greet.sh", "bash tools/greet.sh")
    )
    half = msgspec.structs.replace(
        half,
        tool_calls=[
            msgspec.structs.replace(half.tool_calls[0], status="nonzero_exit"),
            half.tool_calls[1],
        ],
    )
    scores = await score_all(stack.jetstream(), [*solved, *untouched, wrong, half])
    for name, right, left in zip(names, solved, untouched, strict=True):
        good, bad = scores[right.task.id], scores[left.task.id]
        assert (good.status, good.reward) == (ScoreStatus.SCORED, 1.0), (name, good.details)
        assert bad.status is ScoreStatus.SCORED and bad.reward < 1.0, (name, bad.details)
        failed = {c["name"] for c in left.task.metadata["checks"]}
        assert any(f"{n} (" in bad.details[0].message for n in failed), bad.details
    judged = scores[wrong.task.id]
    assert (judged.status, judged.reward) == (ScoreStatus.SCORED, 0.0)
    assert "failed: count (error_count.txt does not hold" in judged.details[0].message
    assert "1 calls, 0 failed" in judged.details[0].message
    judged = scores[half.task.id]
    assert (judged.status, judged.reward) == (ScoreStatus.SCORED, 0.5), judged.details
    said = judged.details[0].message
    assert "1/2 checks passed; failed: executable (tools/greet.sh is not executable)" in said
    assert "2 calls, 1 failed, 1 recovered" in said


async def test_every_template_solved_in_a_live_session_scores_one_from_its_snapshot(
    stack: NATS,
) -> None:
    """The generator's path: commands run in a session, which is snapshotted at the end;
    the judge probes the snapshot and replays nothing."""
    names = sorted(TEMPLATES)
    tasks = [task_of(n, "live", i) for i, n in enumerate(names)]
    made_ = await asyncio.gather(
        *(live(stack, t, made(n).solution) for t, n in zip(tasks, names, strict=True))
    )
    assert all(r.snapshot for r in made_)
    scores = await score_all(stack.jetstream(), list(made_))
    for name, task in zip(names, tasks, strict=True):
        judged = scores[task.id]
        assert (judged.status, judged.reward) == (ScoreStatus.SCORED, 1.0), (name, judged.details)


async def test_a_generated_trajectory_sees_the_files_and_is_judged_on_its_commands(
    stack: NATS, tiny_model: Path
) -> None:
    tokenizer = ChatTokenizer.load(tiny_model)
    name = "count_errors"
    solution = made(name).solution
    # A failed command first: the chain metrics count it, and its recovery.
    commands = ["ls logs", "cat missing.txt", *solution]
    turns = [tokenizer.encode(call_text(c)) for c in commands]
    engine = ScriptedEngine([*turns, tokenizer.encode("Done.") + list(tokenizer.eos_ids)])
    loop = AgentLoop(engine, tokenizer, SandboxTools(stack, timeout_s=30))
    [generated] = await loop.run(task_of(name, "generated", 0))
    assert generated.snapshot is not None and generated.snapshot_error is None  # judged on it
    listing, missing = generated.tool_calls[0], generated.tool_calls[1]
    assert listing.status == "ok" and listing.output.strip().endswith(".log"), listing
    assert missing.status == "nonzero_exit", missing
    scores = await score_all(stack.jetstream(), [generated])
    judged = scores[generated.task.id]
    assert (judged.status, judged.reward) == (ScoreStatus.SCORED, 1.0), judged.details
    assert "3 calls, 1 failed, 1 recovered" in judged.details[0].message


def call_text(command: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'bash', 'arguments': {'code': command}})}</tool_call>"


async def test_no_sandbox_service_is_an_infra_failure(nats_url: str) -> None:
    validator = ValidatorService(
        settings(nats_url, sandbox_timeout_s=1.0, sandbox_grace_s=0.5),
        domains=DomainRegistry([TERMINAL]),
    )
    async with validator, client(nats_url) as nc:
        scored = await score_all(nc.jetstream(), [rollout(task_of("crlf", "nobody", 0), ())])
    [result] = scored.values()
    assert result.status is ScoreStatus.INFRA_FAILURE, result
    assert "sandbox" in (result.error or result.details[0].message)
