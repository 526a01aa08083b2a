"""The agent loop's sandbox side: opening a sample's tool session, and saving its state at
a turn boundary (preemption, checkpoints) and at the end (what the judge scores)."""

from __future__ import annotations

import time

from protocol.messages import FailureKind, RolloutStatus, Task, rollout_id
from services.domains.api import SANDBOX_FILES
from services.domains.sandbox_place import SandboxPlace, place_of
from services.engines.engine import InvalidRequestError
from services.generator.tools import ToolBox, ToolInfraError, ToolSession, WorkspaceUnsaved
from services.generator.trajectory import Trajectory


async def open_session(tools: ToolBox, task: Task, trajectory: Trajectory) -> ToolSession:
    """The sample's tool session: with the task's files, or restored from the sample's
    snapshot when it resumes."""
    place = _place(task)
    # Passed only when the task names a sandbox of its own (a Harbor task's image and
    # limits): a tool box that runs no sandbox never needs to know of one.
    own = {"place": place} if place is not None else {}
    return await tools.open(
        rollout_id(task.id, trajectory.index, task.attempt),
        _tools(task),
        _files(task),
        snapshot=trajectory.snapshot,
        **own,
    )


async def suspend(trajectory: Trajectory, session: ToolSession | None) -> None:
    """Save the sample's sandbox state (its conversation is in the trajectory already)."""
    started = time.monotonic()
    saved = await snapshot(trajectory, session)
    trajectory.suspend(saved, time.monotonic() - started)


async def save_end(trajectory: Trajectory, session: ToolSession) -> None:
    """Snapshot the sandbox of a finished sample: the judge scores the state the model
    actually left, in a session of its own (a replay may not be what the model saw)."""
    if trajectory.suspended or trajectory.status is not RolloutStatus.OK:
        return
    try:
        trajectory.end_snapshot = await session.snapshot()
    except WorkspaceUnsaved as error:
        trajectory.end_snapshot_error = str(error)
    except ToolInfraError as error:
        trajectory.fail(
            RolloutStatus.INFRA_FAILURE, f"tool: end snapshot: {error}", FailureKind.TOOL
        )


async def snapshot(trajectory: Trajectory, session: ToolSession | None) -> str | None:
    """The sandbox state as the sample's tool calls so far left it."""
    return await session.snapshot() if session is not None else trajectory.snapshot


def _tools(task: Task) -> tuple[str, ...]:
    return tuple(task.tools)


def _place(task: Task) -> SandboxPlace | None:
    """The image and limits the task's tool session opens with, if it names them."""
    try:
        return place_of(task.metadata)
    except ValueError as error:
        raise InvalidRequestError(str(error)) from None


def _files(task: Task) -> dict[str, bytes]:
    """The files the task's tool session starts with (a terminal task's prepared directory)."""
    files = task.metadata.get(SANDBOX_FILES) or {}
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise InvalidRequestError(f"task metadata[{SANDBOX_FILES!r}] must map paths to text")
    return {str(path): text.encode() for path, text in files.items()}
