"""Helpers for the harbor domain through the real sandbox service and validator: rollouts
made as the generator makes them (its own tool client, in a session of the task's image
with its limits, snapshotted at the end), and their scores."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from protocol import streams
from protocol.codec import Codec
from protocol.messages import Rollout, ScoredRollout, Task, ToolCall
from services.domains import Domain, DomainRegistry
from services.domains.harbor_domain import HarborProblem, HarborSource
from services.domains.sandbox_place import place_of
from services.generator.tools import SandboxTools, WorkspaceUnsaved
from services.model.tool_format import ToolCallRequest
from services.sandbox.service import SandboxService
from services.validator import ValidatorService
from tests.integration.support import client, stream_entries, wait_count
from tests.integration.test_validator_sandbox import wait_warm
from tests.integration.test_validator_service import publish, settings
from tests.integration.test_validator_terminal import sandbox_settings

SCORED: Codec[ScoredRollout] = Codec(ScoredRollout)
#: Trajectories made at once: each holds a cold container of its task's image.
AT_ONCE = 4


@asynccontextmanager
async def harbor_stack(
    nats_url: str, image: str, tmp: Path, domains: Sequence[Domain]
) -> AsyncIterator[NATS]:
    sandbox = SandboxService(sandbox_settings(nats_url, image, tmp))
    validator = ValidatorService(
        settings(nats_url, sandbox_timeout_s=60.0, sandbox_grace_s=60.0, max_in_flight=4),
        domains=DomainRegistry(domains),
    )
    async with sandbox, validator, client(nats_url) as nc:
        await wait_warm(sandbox, 2)
        yield nc


def problems(domain: Domain) -> tuple[HarborProblem, ...]:
    assert isinstance(domain.source, HarborSource)
    return domain.source.problems


def task_of(domain: Domain, problem: HarborProblem, label: str, index: int) -> Task:
    task = domain.task(problem.problem(), "train", 0, index)
    return msgspec.structs.replace(task, id=f"{label}-{index}")


def oracle(problem: HarborProblem) -> str:
    assert problem.task.solution is not None, problem.task.path
    return problem.task.solution.read_text()


def rollout(task: Task, calls: list[ToolCall], **fields: object) -> Rollout:
    return Rollout(
        id=f"{task.id}/0",
        task=task,
        sample_index=0,
        completion_text="Done.",
        tool_calls=calls,
        **fields,  # type: ignore[arg-type]
    )


async def live(nc: NATS, task: Task, commands: Sequence[str]) -> Rollout:
    """The rollout of a trajectory whose bash calls are ``commands``, as the generator
    makes it: one real session in the task's image with its limits, outputs recorded,
    snapshotted at the end (a trajectory without a call opens none, as the generator's)."""
    session = await SandboxTools(nc, timeout_s=120).open(
        f"{task.id}/0", ("bash",), {}, place=place_of(task.metadata)
    )
    calls: list[ToolCall] = []
    snapshot, error = None, None
    try:
        for turn, command in enumerate(commands):
            body = json.dumps({"name": "bash", "arguments": {"code": command}})
            outcome = await session.call(
                ToolCallRequest(name="bash", arguments={"code": command}, raw=body)
            )
            calls.append(
                ToolCall(
                    turn=turn, name="bash", arguments=body, output=outcome.output,
                    status=outcome.status,
                )
            )  # fmt: skip
        snapshot = await session.snapshot() if commands else None
    except WorkspaceUnsaved as unsaved:
        error = str(unsaved)
    finally:
        await session.close()
    return rollout(task, calls, snapshot=snapshot, snapshot_error=error)


async def live_all(nc: NATS, work: Sequence[tuple[Task, Sequence[str]]]) -> list[Rollout]:
    gate = asyncio.Semaphore(AT_ONCE)

    async def one(task: Task, commands: Sequence[str]) -> Rollout:
        async with gate:
            return await live(nc, task, commands)

    return await asyncio.gather(*(one(task, commands) for task, commands in work))


async def score_all(
    js: JetStreamContext, rollouts: Sequence[Rollout], timeout_s: float = 400
) -> dict[str, ScoredRollout]:
    for item in rollouts:
        await publish(js, item)
    await wait_count(js, streams.SCORED.name, len(rollouts), timeout_s=timeout_s)
    scored = [SCORED.decode(e.data) for e in await stream_entries(js, streams.SCORED.name)]
    return {s.rollout.task.id: s for s in scored}


def said(scored: ScoredRollout) -> str:
    return scored.details[0].message if scored.details else (scored.error or "")
