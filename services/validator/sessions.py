"""Sandbox sessions for validators: open one with files or from a snapshot, run in it,
snapshot it, close it.

The multi-step sibling of :mod:`services.validator.sandbox`: every way a request can
fail without the answer asked for (no sandbox service, no answer in time, an error
reply, bytes that do not decode) is an :class:`InfraFailure`, never a score.  The one
exception is a snapshot refused as ``bad_request``: the work directory the commands left
cannot be archived (or their sandbox is gone), which is the candidate's doing:
:class:`WorkspaceLost`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Final, Protocol

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
    SandboxLimits,
    SandboxOpen,
    SandboxResult,
    SandboxSession,
    SandboxSnapshot,
    SandboxSnapshotRequest,
)
from services.validator.base import InfraFailure

_OPENED: Final[Codec[SandboxSession | ErrorReply]] = Codec(SandboxSession | ErrorReply)
_RAN: Final[Codec[SandboxResult | ErrorReply]] = Codec(SandboxResult | ErrorReply)
_SAVED: Final[Codec[SandboxSnapshot | ErrorReply]] = Codec(SandboxSnapshot | ErrorReply)
#: Seconds a close may take; an unclosed session is reclaimed by its lease anyway.
CLOSE_TIMEOUT_S: Final = 5.0


class WorkspaceLost(Exception):
    """The session's work directory cannot be snapshotted: what its commands left."""


class ShellSession(Protocol):
    async def run(self, language: str, code: str, stdin: bytes = b"") -> SandboxResult: ...

    async def probe(self, command: list[str], outputs: list[str]) -> SandboxResult:
        """Execute ``command`` (argv, no shell of the session's language) and send back
        the work-directory files ``outputs`` that are regular files and fit."""
        ...

    async def snapshot(self) -> str:
        """Archive the work directory; its snapshot id (or :class:`WorkspaceLost`)."""
        ...

    async def close(self) -> None: ...


class Sessions(Protocol):
    """Opens sandbox sessions; tests substitute fakes at this boundary."""

    async def open(
        self,
        name: str,
        files: Mapping[str, bytes],
        limits: SandboxLimits,
        snapshot: str | None = None,
        *,
        checker: bool = False,
    ) -> ShellSession:
        """``checker``: a fresh sandbox of the checker user, where no candidate ran."""
        ...


class NatsSessions:
    """Sessions of the sandbox service, over NATS request/reply."""

    def __init__(self, nc: NATS, timeout_s: float) -> None:
        self._nc = nc
        #: Per request: an exec's own time limit plus start-up, queueing and the reply.
        self._timeout_s = timeout_s

    async def open(
        self,
        name: str,
        files: Mapping[str, bytes],
        limits: SandboxLimits,
        snapshot: str | None = None,
        *,
        checker: bool = False,
    ) -> ShellSession:
        # A snapshot our store no longer has is refused: an InfraFailure like any refusal.
        request = SandboxOpen(
            id=f"{name}-{uuid.uuid4().hex[:8]}",
            files=dict(files),
            limits=limits,
            snapshot=snapshot,
            checker=checker,
        )
        reply = await _request(
            self._nc, subjects.sandbox_session(), encode(request), self._timeout_s
        )
        opened = _decoded(_OPENED, reply, "sandbox session refused")
        assert isinstance(opened, SandboxSession)
        return _NatsSession(self._nc, opened, self._timeout_s)


class _NatsSession:
    def __init__(self, nc: NATS, session: SandboxSession, timeout_s: float) -> None:
        self._nc = nc
        self._session = session
        self._timeout_s = timeout_s

    async def run(self, language: str, code: str, stdin: bytes = b"") -> SandboxResult:
        request = SandboxExec(
            id=uuid.uuid4().hex,
            session=self._session.session,
            language=language,
            code=code,
            stdin=stdin,
        )
        return await self._exec(request)

    async def probe(self, command: list[str], outputs: list[str]) -> SandboxResult:
        request = SandboxExec(
            id=uuid.uuid4().hex, session=self._session.session, command=command, outputs=outputs
        )
        return await self._exec(request)

    async def _exec(self, request: SandboxExec) -> SandboxResult:
        reply = await _request(self._nc, self._session.subject, encode(request), self._timeout_s)
        result = _decoded(_RAN, reply, "sandbox refused the exec")
        assert isinstance(result, SandboxResult)
        return result

    async def snapshot(self) -> str:
        request = SandboxSnapshotRequest(session=self._session.session)
        reply = await _request(self._nc, self._session.subject, encode(request), self._timeout_s)
        try:
            saved = _SAVED.decode(reply)
        except DecodeError as error:
            raise InfraFailure(f"the sandbox sent an unreadable reply: {error.message}") from None
        if isinstance(saved, ErrorReply) and saved.code is ErrorCode.BAD_REQUEST:
            raise WorkspaceLost(saved.message)
        done = _decoded(_SAVED, reply, "sandbox refused the snapshot")
        assert isinstance(done, SandboxSnapshot)
        return done.snapshot

    async def close(self) -> None:
        close = encode(SandboxClose(session=self._session.session))
        try:
            await self._nc.request(self._session.subject, close, timeout=CLOSE_TIMEOUT_S)
        except (nats.errors.Error, TimeoutError):
            return


async def _request(nc: NATS, subject: str, payload: bytes, timeout_s: float) -> bytes:
    try:
        reply = await nc.request(subject, payload, timeout=timeout_s, headers=_trace_headers())
    except nats.errors.NoRespondersError:
        raise InfraFailure(f"no sandbox service answers on {subject}") from None
    except (nats.errors.TimeoutError, TimeoutError):
        raise InfraFailure(
            f"the sandbox did not answer on {subject} within {timeout_s:.1f}s"
        ) from None
    except nats.errors.Error as error:
        raise InfraFailure(f"sandbox request failed: {error!r}") from None
    return bytes(reply.data)


def _decoded(codec: Codec[Any], data: bytes, refused: str) -> object:
    try:
        reply = codec.decode(data)
    except DecodeError as error:
        raise InfraFailure(f"the sandbox sent an unreadable reply: {error.message}") from None
    if isinstance(reply, ErrorReply):
        raise InfraFailure(f"{refused} ({reply.code.value}): {reply.message}")
    return reply


def _trace_headers() -> dict[str, str]:
    # The runtime binds the rollout's trace id per message; sandbox work for it carries it on.
    trace_id = structlog.contextvars.get_contextvars().get("trace_id")
    return {headers.TRACE_ID: str(trace_id)} if trace_id else {}
