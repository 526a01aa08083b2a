"""Asyncio client for the sandbox agent's unix-socket protocol.

The wire format (4-byte big-endian length + a UTF-8 JSON object, request/response in
sequence) and the semantics of each op are documented at the top of
``services/sandbox/agent/protocol.py``.  This module turns it into typed calls:

    client = await AgentClient.connect(path, timeout_s=5.0)   # waits for the socket
    reply = await client.exec(ExecRequest(id="1", code="print(1)"), timeout_s=15.0)
    killed = await client.reset(timeout_s=5.0)
    reply = await client.exec(request, timeout_s=15.0, reset_after=True)  # resets unasked
    killed = await client.reset(timeout_s=5.0)  # reads the answer of that reset
    await client.close()

Errors: ``AgentUnavailable`` (cannot connect, or the connection dropped: the agent
died; ``AgentProtocolError`` is its subclass for a malformed reply), ``AgentTimeout``
(no answer in time: the outer watchdog case), ``AgentRejected`` (an ``ok: false``
reply: a bad request, or a failed reset).  After ``AgentUnavailable`` or
``AgentTimeout`` the client is closed: a request cut short leaves the stream unusable,
and closing the connection is also what tells the agent to kill a running exec.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from protocol.messages import SandboxStatus

#: Frames above this are refused in both directions (as by the agent).
MAX_FRAME = 64 * 1024 * 1024
HEADER = struct.Struct(">I")
#: How often ``connect`` retries while the agent's socket is not there yet.
CONNECT_RETRY_S = 0.02


class AgentError(Exception):
    """Base of the agent client's errors; ``path`` is the agent's socket."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{message} (agent {path})")
        self.path = path


class AgentUnavailable(AgentError):
    """Cannot connect, or the connection dropped mid-request: the agent is gone."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, f"agent unavailable: {reason}")
        self.reason = reason


class AgentProtocolError(AgentUnavailable):
    """The agent answered something that is not a valid reply; the client closed."""


class AgentTimeout(AgentError):
    """No answer within ``timeout_s``; the client closed (the agent cancels a running exec)."""

    def __init__(self, path: str, op: str, timeout_s: float) -> None:
        super().__init__(path, f"no answer to {op!r} within {timeout_s}s")
        self.op = op
        self.timeout_s = timeout_s


class AgentRejected(AgentError):
    """The agent answered ``ok: false``: a bad request (or a failed reset)."""

    def __init__(self, path: str, op: str, error: str) -> None:
        super().__init__(path, f"{op!r} rejected: {error}")
        self.op = op
        self.error = error


@dataclass(frozen=True, slots=True)
class ExecLimits:
    """Per-exec overrides of the agent's rlimit options; None keeps the agent's setting."""

    memory_bytes: int | None = None
    nproc: int | None = None
    nofile: int | None = None
    fsize_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """One execution: exactly one of ``code`` (in ``language``) and ``argv``."""

    id: str
    code: str | None = None
    argv: Sequence[str] | None = None
    #: None means "python" for code; ignored for argv.
    language: str | None = None
    stdin: bytes = b""
    #: Written under the workdir before running: relative path -> content.
    files: Mapping[str, bytes] = field(default_factory=dict)
    timeout_s: float = 10.0
    #: Cap of stdout and of stderr, each (the agent allows at most 16 MiB).
    output_bytes: int = 1024 * 1024
    env: Mapping[str, str] = field(default_factory=dict)
    limits: ExecLimits | None = None
    #: Workdir files the reply carries back once the run is over (within output_bytes).
    outputs: Sequence[str] = ()

    def __post_init__(self) -> None:
        if (self.code is None) == (self.argv is None):
            raise ValueError("exactly one of `code` and `argv` must be set")

    def to_wire(self) -> dict[str, Any]:
        limits = None
        if self.limits is not None:
            limits = {
                "memory_bytes": self.limits.memory_bytes,
                "nproc": self.limits.nproc,
                "nofile": self.limits.nofile,
                "fsize_bytes": self.limits.fsize_bytes,
            }
        return {
            "op": "exec",
            "id": self.id,
            "language": self.language,
            "code": self.code,
            "argv": list(self.argv) if self.argv is not None else None,
            "stdin_b64": _b64(self.stdin),
            "files": {path: _b64(data) for path, data in self.files.items()},
            "timeout_s": self.timeout_s,
            "output_bytes": self.output_bytes,
            "env": dict(self.env),
            "limits": limits,
            "outputs": list(self.outputs),
        }


@dataclass(frozen=True, slots=True)
class ExecReply:
    """The agent's result.  ``status`` is never ``oom``: the host derives that from cgroups."""

    id: str
    status: SandboxStatus
    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    error: str | None
    #: The requested outputs that exist as regular files and fit: relative path -> content.
    outputs: Mapping[str, bytes] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> ExecReply:
        """Raises KeyError, TypeError or ValueError on a malformed reply."""
        return cls(
            id=_typed(d["id"], str),
            status=SandboxStatus(d["status"]),
            exit_code=_optional(d["exit_code"], int),
            signal=_optional(d["signal"], int),
            stdout=base64.b64decode(_typed(d["stdout_b64"], str), validate=True),
            stderr=base64.b64decode(_typed(d["stderr_b64"], str), validate=True),
            stdout_truncated=_typed(d["stdout_truncated"], bool),
            stderr_truncated=_typed(d["stderr_truncated"], bool),
            duration_s=float(_typed(d["duration_s"], (int, float))),
            error=_optional(d["error"], str),
            outputs=_outputs(d.get("outputs_b64") or {}),
        )


def _frame(path: str, op: str, payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise AgentRejected(path, op, f"request of {len(body)} bytes over the frame cap")
    return HEADER.pack(len(body)) + body


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _outputs(raw: Any) -> dict[str, bytes]:
    return {
        _typed(path, str): base64.b64decode(_typed(data, str), validate=True)
        for path, data in _typed(raw, dict).items()
    }


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"expected {kind}, got {type(value).__name__}")
    return value


def _optional(value: Any, kind: type) -> Any:
    return None if value is None else _typed(value, kind)


class AgentClient:
    """One connection to one agent; requests are sent one at a time (a lock orders them)."""

    def __init__(self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.path = path
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()
        self._closed = False
        #: A reset was written right behind an exec's reply: its answer is the next frame.
        self._reset_ahead = False

    @classmethod
    async def connect(cls, path: str | Path, timeout_s: float) -> AgentClient:
        """Connect, waiting up to ``timeout_s`` for the socket to appear and accept."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last = "no attempt"
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AgentUnavailable(str(path), f"no agent within {timeout_s}s ({last})")
            try:
                async with asyncio.timeout(remaining):
                    reader, writer = await asyncio.open_unix_connection(str(path))
                return cls(str(path), reader, writer)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                last = f"{type(exc).__name__}: {exc.strerror}"
            except TimeoutError:
                last = "connect timed out"
                continue
            except OSError as exc:
                raise AgentUnavailable(str(path), f"cannot connect: {exc}") from exc
            await asyncio.sleep(min(CONNECT_RETRY_S, max(0.0, deadline - loop.time())))

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def dead(self) -> bool:
        """Closed, or the agent hung up (seen without a request: the transport reads ahead)."""
        return self._closed or self._reader.at_eof()

    async def ping(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """{"ok": true, "pid": N, "version": 1, "languages": [...]}."""
        return await self._request("ping", {"op": "ping"}, timeout_s)

    async def exec(
        self, request: ExecRequest, *, timeout_s: float, reset_after: bool = False
    ) -> ExecReply:
        """Run one execution; ``timeout_s`` is the outer watchdog (> request.timeout_s).

        ``reset_after``: the agent resets as soon as its reply is out, and cleans up while
        the host is still answering its caller; ``reset()`` reads the reset's answer, and
        must come before any other request.
        """
        payload = request.to_wire()
        if reset_after:
            payload["reset_after"] = True
        reply = await self._request("exec", payload, timeout_s)
        try:
            result = ExecReply.from_wire(reply)
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            self._abort()
            raise AgentProtocolError(self.path, f"malformed exec reply: {exc!r}") from exc
        if result.id != request.id:
            self._abort()
            raise AgentProtocolError(self.path, f"reply for {result.id!r}, not {request.id!r}")
        return result

    async def reset(self, timeout_s: float) -> int:
        """Kill leftovers and empty the workdir; the number of processes killed.

        After ``exec(..., reset_after=True)`` the agent resets unasked: this only waits
        for its answer."""
        reply = await self._request("reset", {"op": "reset"}, timeout_s)
        killed = reply.get("killed")
        if not isinstance(killed, int):
            self._abort()
            raise AgentProtocolError(self.path, f"malformed reset reply: {reply!r}")
        return killed

    async def archive(self, timeout_s: float) -> bytes:
        """The workdir as a gzip tar (a session snapshot)."""
        reply = await self._request("archive", {"op": "archive"}, timeout_s)
        data = reply.get("data_b64")
        if not isinstance(data, str):
            self._abort()
            raise AgentProtocolError(self.path, "malformed archive reply")
        return base64.b64decode(data)

    async def extract(self, data: bytes, timeout_s: float) -> int:
        """Replace the workdir's content with an archive's; the number of files written."""
        payload = {"op": "extract", "data_b64": base64.b64encode(data).decode()}
        reply = await self._request("extract", payload, timeout_s)
        files = reply.get("files")
        if not isinstance(files, int):
            self._abort()
            raise AgentProtocolError(self.path, "malformed extract reply")
        return files

    async def close(self) -> None:
        """Close the connection; safe to call twice."""
        if self._closed:
            return
        self._abort()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- internals

    def _abort(self) -> None:
        self._closed = True
        self._writer.close()

    async def _request(self, op: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``payload`` (not a reset the agent does unasked) and read its reply."""
        body = _frame(self.path, op, payload)
        async with self._lock:
            sent = self._take_ahead(op)
            try:
                async with asyncio.timeout(timeout_s):
                    if not sent:
                        self._writer.write(body)
                        await self._writer.drain()
                    reply = await self._read_frame()
                    # The agent answers a reset after it, unasked (see exec).
                    self._reset_ahead = payload.get("reset_after") is True
            except TimeoutError as exc:
                self._abort()
                raise AgentTimeout(self.path, op, timeout_s) from exc
            except (OSError, asyncio.IncompleteReadError) as exc:
                self._abort()
                reason = f"connection lost during {op!r}: {exc!r}"
                raise AgentUnavailable(self.path, reason) from exc
            except BaseException:  # cancelled mid-request: the stream is out of step
                self._abort()
                raise
        if reply.get("ok") is False:
            raise AgentRejected(self.path, op, str(reply.get("error")))
        return reply

    def _take_ahead(self, op: str) -> bool:
        """Whether ``op`` is the reset the agent does unasked, whose answer is the next frame."""
        if self._closed:
            raise AgentUnavailable(self.path, "connection closed")
        ahead, self._reset_ahead = self._reset_ahead, False
        if ahead and op != "reset":
            # The reset's answer would be read as this request's: the stream is out of step.
            self._abort()
            reason = f"{op!r} before the answer to the reset behind an exec"
            raise AgentUnavailable(self.path, reason)
        return ahead

    async def _read_frame(self) -> dict[str, Any]:
        (length,) = HEADER.unpack(await self._reader.readexactly(HEADER.size))
        if length > MAX_FRAME:
            self._abort()
            raise AgentProtocolError(self.path, f"reply frame of {length} bytes over the cap")
        try:
            reply = json.loads(await self._reader.readexactly(length))
        except ValueError as exc:
            self._abort()
            raise AgentProtocolError(self.path, f"reply is not JSON: {exc}") from exc
        if not isinstance(reply, dict):
            self._abort()
            raise AgentProtocolError(self.path, "reply is not a JSON object")
        return reply
