"""Tool calls of the agent loop: parsing the model's calls and running them.

Format (documented in docs/generator.md): the model writes
``<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>``.
A malformed call is the model's mistake and comes back to it as an error observation;
a tool that cannot run because the machinery failed is an infrastructure failure.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import nats.errors
import structlog
from nats.aio.client import Client as NATS

from protocol import headers, subjects
from protocol.codec import Codec, encode
from protocol.errors import DecodeError, ErrorCode
from protocol.messages import (
    ErrorReply,
    SandboxClose,
    SandboxExec,
    SandboxOpen,
    SandboxResult,
    SandboxSession,
    SandboxSnapshot,
    SandboxSnapshotRequest,
    SandboxStatus,
)

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
#: Tool name -> sandbox language.
SANDBOX_TOOLS: Mapping[str, str] = {"python": "python", "bash": "bash"}


class ToolInfraError(RuntimeError):
    """The tool machinery failed (no sandbox, sandbox crashed): the rollout is infra_failure."""


class WorkspaceUnsaved(ToolInfraError):
    """The sandbox refused to snapshot what the sample left (a work directory that cannot
    be archived, a sandbox its own command spoiled): the sample's doing at its end (the
    loop records it), an infra failure where a checkpoint or a preemption needs one."""


@dataclass(frozen=True, kw_only=True)
class ToolCallRequest:
    name: str
    arguments: dict[str, Any]
    raw: str


@dataclass(frozen=True, kw_only=True)
class ToolOutcome:
    output: str
    status: str
    duration_s: float


def parse_tool_call(text: str) -> ToolCallRequest | str:
    """The last tool call in ``text``, or an error message for the model."""
    found = _CALL.findall(text)
    if not found:
        return "no <tool_call>...</tool_call> block found"
    raw = found[-1].strip()
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as error:
        return f"tool call is not valid JSON: {error.msg} at char {error.pos}"
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return 'tool call needs an object with a string "name"'
    arguments = body.get("arguments", {})
    if not isinstance(arguments, dict):
        return 'tool call "arguments" must be an object'
    return ToolCallRequest(name=body["name"], arguments=arguments, raw=raw)


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
    ) -> ToolSession:
        """A session for one trajectory; ``files`` are in its working directory from the
        start, or, for a resumed trajectory, whatever ``snapshot`` saved."""
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


_SESSION_REPLY: Codec[SandboxSession | ErrorReply] = Codec(SandboxSession | ErrorReply)
_EXEC_REPLY: Codec[SandboxResult | ErrorReply] = Codec(SandboxResult | ErrorReply)
_SNAPSHOT_REPLY: Codec[SandboxSnapshot | ErrorReply] = Codec(SandboxSnapshot | ErrorReply)


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
    ) -> ToolSession:
        start = _Start(files=dict(files or {}), snapshot=snapshot, on_open=self._on_open)
        return _SandboxSession(
            self._nc, trajectory_id, allowed, self._timeout_s, _trace_headers(), start
        )


@dataclass(frozen=True, kw_only=True)
class _Start:
    """What a session starts from: a task's files, or a preempted trajectory's snapshot."""

    files: dict[str, bytes]
    snapshot: str | None
    #: Told the trajectory id once its session is open (sandbox-aware admission).
    on_open: Callable[[str], None] | None


class _SandboxSession:
    """Opened lazily on the first call, so a conversation without tool calls costs nothing."""

    def __init__(
        self,
        nc: NATS,
        trajectory_id: str,
        allowed: tuple[str, ...],
        timeout_s: float,
        trace: dict[str, str],
        start: _Start,
    ):
        self._nc = nc
        self._trajectory = trajectory_id
        self._id = re.sub(r"[^A-Za-z0-9_-]", "-", trajectory_id)
        self._allowed = allowed
        self._timeout_s = timeout_s
        #: Every request of the session carries the trace id of the task it works for.
        self._trace = trace
        self._session: SandboxSession | None = None
        self._start = start

    async def _request(self, subject: str, payload: bytes) -> bytes:
        try:
            reply = await self._nc.request(
                subject, payload, timeout=self._timeout_s, headers=self._trace or None
            )
        except (nats.errors.Error, TimeoutError) as error:
            raise ToolInfraError(
                f"sandbox service did not answer on {subject}: {error!r}"
            ) from error
        return bytes(reply.data)

    async def _open(self) -> SandboxSession:
        if self._session is None:
            start = self._start
            request = SandboxOpen(
                id=f"{self._id}-{uuid.uuid4().hex[:8]}",
                # A snapshot holds the files as the trajectory left them.
                files={} if start.snapshot else start.files,
                snapshot=start.snapshot,
            )
            data = await self._request(subjects.sandbox_session(), encode(request))
            self._session = _decoded_session(data)
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
        result = _decoded_result(await self._request(session.subject, encode(exec_)))
        output = result.stdout + (f"\n{result.stderr}" if result.stderr else "")
        return ToolOutcome(
            output=output, status=result.status.value, duration_s=time.monotonic() - started
        )

    async def snapshot(self) -> str | None:
        if self._session is None:
            return self._start.snapshot  # not opened again since: that state still holds
        request = SandboxSnapshotRequest(session=self._session.session)
        data = await self._request(self._session.subject, encode(request))
        refused = _refused(data)
        if refused is not None:
            raise WorkspaceUnsaved(refused)
        reply = _decoded(_SNAPSHOT_REPLY, data, "sandbox refused the snapshot")
        assert isinstance(reply, SandboxSnapshot)
        return reply.snapshot

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            # Best effort: an unclosed session is reclaimed by its lease anyway.
            try:
                await self._nc.request(
                    session.subject,
                    encode(SandboxClose(session=session.session)),
                    timeout=5,
                    headers=self._trace or None,
                )
            except (nats.errors.Error, TimeoutError):
                return


def _trace_headers() -> dict[str, str]:
    # The runtime binds the task's trace id while its handler runs, and the session is
    # opened there: read it once, so calls made from any task of the loop carry it.
    trace_id = structlog.contextvars.get_contextvars().get("trace_id")
    return {headers.TRACE_ID: headers.clean(str(trace_id))} if trace_id else {}


def _decoded_session(data: bytes) -> SandboxSession:
    reply = _decoded(_SESSION_REPLY, data, "sandbox session refused")
    assert isinstance(reply, SandboxSession)
    return reply


def _decoded_result(data: bytes) -> SandboxResult:
    reply = _decoded(_EXEC_REPLY, data, "sandbox refused the call")
    assert isinstance(reply, SandboxResult)
    if reply.status is SandboxStatus.INFRA_ERROR:
        raise ToolInfraError(f"sandbox failed: {reply.error or 'infra_error'}")
    return reply


def _refused(data: bytes) -> str | None:
    """A ``bad_request`` reply's message: the request was sound, the workspace was not."""
    try:
        reply = _SNAPSHOT_REPLY.decode(data)
    except DecodeError:
        return None
    if isinstance(reply, ErrorReply) and reply.code is ErrorCode.BAD_REQUEST:
        return reply.message
    return None


def _decoded(codec: Codec[Any], data: bytes, refused: str) -> object:
    """The reply, or :class:`ToolInfraError` for an error reply or bytes that do not decode."""
    try:
        reply = codec.decode(data)
    except DecodeError as error:
        raise ToolInfraError(f"bad reply from the sandbox service: {error}") from error
    if isinstance(reply, ErrorReply):
        raise ToolInfraError(f"{refused}: {reply.code}: {reply.message}")
    return reply
