"""Tool calls of the agent loop: running the model's calls.

Format (documented in docs/generator.md, parsed by services.model.tool_format): the
model writes ``<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>``.
A malformed call is the model's mistake and comes back to it as an error observation;
a tool that cannot run because the machinery failed is an infrastructure failure.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from nats.aio.client import Client as NATS

from protocol.messages import (
    SandboxExec,
    SandboxLimits,
    SandboxOpen,
    SandboxSession,
    SandboxStatus,
)
from services.domains.sandbox_place import SandboxPlace
from services.model.tool_format import ToolCallRequest
from services.runtime.ask import AskError, BadReply, Refused, current_trace_id
from services.sandbox.client import SandboxClient, WorkspaceRefused

#: Tool name -> sandbox language.
SANDBOX_TOOLS: Mapping[str, str] = {"python": "python", "bash": "bash"}


class ToolInfraError(RuntimeError):
    """The tool machinery failed (no sandbox, sandbox crashed): the rollout is infra_failure."""


class WorkspaceUnsaved(ToolInfraError):
    """The sandbox refused to snapshot what the sample left (a work directory that cannot
    be archived, a sandbox its own command spoiled): the sample's doing at its end (the
    loop records it), an infra failure where a checkpoint or a preemption needs one."""


@dataclass(frozen=True, kw_only=True)
class ToolOutcome:
    output: str
    status: str
    duration_s: float


class ToolSession(Protocol):
    async def call(self, request: ToolCallRequest) -> ToolOutcome: ...

    async def snapshot(self) -> str | None:
        """Save the session's state (a preempted trajectory's); None when it has none."""
        ...

    async def close(self) -> None: ...


class ToolBox(Protocol):
    """Opens one tool session per trajectory (a sandbox kept for its whole conversation)."""

    async def open(
        self,
        trajectory_id: str,
        allowed: tuple[str, ...],
        files: Mapping[str, bytes] | None = None,
        snapshot: str | None = None,
        *,
        place: SandboxPlace | None = None,
    ) -> ToolSession:
        """A session for one trajectory; ``files`` are in its working directory from the
        start, or, for a resumed trajectory, whatever ``snapshot`` saved; ``place``: the
        image and limits the task's sandbox needs (None: the service's defaults)."""
        ...


class LocalTools:
    """Deterministic tools computed in-process (no sandbox): ``echo`` and ``add``.

    For benchmarks and tests of the loop itself; real domains use :class:`SandboxTools`.
    """

    async def open(
        self,
        trajectory_id: str,
        allowed: tuple[str, ...],
        files: Mapping[str, bytes] | None = None,
        snapshot: str | None = None,
        *,
        place: SandboxPlace | None = None,
    ) -> ToolSession:
        return _LocalSession(allowed)


class _LocalSession:
    def __init__(self, allowed: tuple[str, ...]) -> None:
        self._allowed = allowed

    async def call(self, request: ToolCallRequest) -> ToolOutcome:
        if request.name not in self._allowed:
            return ToolOutcome(
                output=f"unknown tool {request.name!r}", status="error", duration_s=0
            )
        args = request.arguments
        if request.name == "add":
            total = sum(float(v) for v in args.values() if isinstance(v, int | float))
            return ToolOutcome(output=f"{total:g}", status="ok", duration_s=0.0)
        return ToolOutcome(output=json.dumps(args, sort_keys=True), status="ok", duration_s=0.0)

    async def snapshot(self) -> str | None:
        return None  # stateless

    async def close(self) -> None:
        return None


class SandboxTools:
    """``python`` and ``bash`` tools run in a sandbox session of the sandbox service."""

    def __init__(
        self,
        nc: NATS,
        *,
        timeout_s: float = 60.0,
        on_open: Callable[[str], None] | None = None,
    ) -> None:
        self._nc = nc
        self._timeout_s = timeout_s
        #: Told the trajectory id once its session is open (sandbox-aware admission).
        self._on_open = on_open

    async def open(
        self,
        trajectory_id: str,
        allowed: tuple[str, ...],
        files: Mapping[str, bytes] | None = None,
        snapshot: str | None = None,
        *,
        place: SandboxPlace | None = None,
    ) -> ToolSession:
        start = _Start(
            files=dict(files or {}),
            snapshot=snapshot,
            place=place or SandboxPlace(),
            on_open=self._on_open,
        )
        # The runtime binds the task's trace id while its handler runs, and the session is
        # opened there: read it once, so calls made from any task of the loop carry it.
        client = SandboxClient(self._nc, self._timeout_s, trace_id=current_trace_id())
        return _SandboxSession(client, trajectory_id, allowed, start)


@dataclass(frozen=True, kw_only=True)
class _Start:
    """What a session starts from: a task's files, or a preempted trajectory's snapshot."""

    files: dict[str, bytes]
    snapshot: str | None
    #: The task's own image and limits, if it has them.
    place: SandboxPlace
    #: Told the trajectory id once its session is open (sandbox-aware admission).
    on_open: Callable[[str], None] | None


class _SandboxSession:
    """Opened lazily on the first call, so a conversation without tool calls costs nothing."""

    def __init__(
        self,
        client: SandboxClient,
        trajectory_id: str,
        allowed: tuple[str, ...],
        start: _Start,
    ):
        #: Every request of the session carries the trace id of the task it works for.
        self._client = client
        self._trajectory = trajectory_id
        self._id = re.sub(r"[^A-Za-z0-9_-]", "-", trajectory_id)
        self._allowed = allowed
        self._session: SandboxSession | None = None
        self._start = start

    async def _open(self) -> SandboxSession:
        if self._session is None:
            start = self._start
            request = SandboxOpen(
                id=f"{self._id}-{uuid.uuid4().hex[:8]}",
                # A snapshot holds the files as the trajectory left them.
                files={} if start.snapshot else start.files,
                snapshot=start.snapshot,
                limits=start.place.limits or SandboxLimits(),
                image=start.place.image,
            )
            try:
                self._session = await self._client.open(request)
            except AskError as error:
                raise _infra(error, "sandbox session refused") from error
            if start.on_open is not None:
                start.on_open(self._trajectory)
        return self._session

    async def call(self, request: ToolCallRequest) -> ToolOutcome:
        language = SANDBOX_TOOLS.get(request.name)
        if language is None or request.name not in self._allowed:
            return ToolOutcome(
                output=f"unknown tool {request.name!r}", status="error", duration_s=0
            )
        code = request.arguments.get("code")
        if not isinstance(code, str):
            return ToolOutcome(
                output='arguments need a string "code"', status="error", duration_s=0
            )
        session = await self._open()
        started = time.monotonic()
        exec_ = SandboxExec(
            id=uuid.uuid4().hex, session=session.session, language=language, code=code
        )
        try:
            result = await self._client.run(session, exec_)
        except AskError as error:
            raise _infra(error, "sandbox refused the call") from error
        if result.status is SandboxStatus.INFRA_ERROR:
            raise ToolInfraError(f"sandbox failed: {result.error or 'infra_error'}")
        output = result.stdout + (f"\n{result.stderr}" if result.stderr else "")
        return ToolOutcome(
            output=output, status=result.status.value, duration_s=time.monotonic() - started
        )

    async def snapshot(self) -> str | None:
        if self._session is None:
            return self._start.snapshot  # not opened again since: that state still holds
        try:
            saved = await self._client.snapshot(self._session)
        except WorkspaceRefused as error:
            raise WorkspaceUnsaved(error.message) from error
        except AskError as error:
            raise _infra(error, "sandbox refused the snapshot") from error
        return saved.snapshot

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            # Best effort: an unclosed session is reclaimed by its lease anyway.
            with contextlib.suppress(AskError):
                await self._client.close(session)


def _infra(error: AskError, refused: str) -> ToolInfraError:
    """Every way the sandbox service can fail to answer, as the infra failure it is."""
    if isinstance(error, Refused):
        return ToolInfraError(f"{refused}: {error.code}: {error.message}")
    if isinstance(error, BadReply):
        return ToolInfraError(f"bad reply from the sandbox service: {error.reason}")
    return ToolInfraError(f"sandbox service did not answer on {error.subject}: {error!r}")
