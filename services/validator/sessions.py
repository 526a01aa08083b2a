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

import contextlib
import uuid
from collections.abc import Mapping
from typing import Protocol

from nats.aio.client import Client as NATS

from protocol.messages import SandboxExec, SandboxLimits, SandboxOpen, SandboxResult, SandboxSession
from services.runtime.ask import AskError, Refused
from services.sandbox.client import SandboxClient, WorkspaceRefused
from services.validator.base import InfraFailure
from services.validator.sandbox import sandbox_failure


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
        image: str | None = None,
    ) -> ShellSession:
        """``checker``: a fresh sandbox of the checker user, where no candidate ran;
        ``image``: a task image to run instead of the service's own."""
        ...


class NatsSessions:
    """Sessions of the sandbox service, over NATS request/reply."""

    def __init__(self, nc: NATS, timeout_s: float) -> None:
        #: Per request: an exec's own time limit plus start-up, queueing and the reply.
        self._client = SandboxClient(nc, timeout_s)

    async def open(
        self,
        name: str,
        files: Mapping[str, bytes],
        limits: SandboxLimits,
        snapshot: str | None = None,
        *,
        checker: bool = False,
        image: str | None = None,
    ) -> ShellSession:
        # A snapshot our store no longer has is refused: an InfraFailure like any refusal.
        request = SandboxOpen(
            id=f"{name}-{uuid.uuid4().hex[:8]}",
            files=dict(files),
            limits=limits,
            snapshot=snapshot,
            checker=checker,
            image=image,
        )
        try:
            opened = await self._client.open(request)
        except AskError as error:
            raise _infra(error, "sandbox session refused") from None
        return _NatsSession(self._client, opened)


class _NatsSession:
    def __init__(self, client: SandboxClient, session: SandboxSession) -> None:
        self._client = client
        self._session = session

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
        try:
            return await self._client.run(self._session, request)
        except AskError as error:
            raise _infra(error, "sandbox refused the exec") from None

    async def snapshot(self) -> str:
        try:
            saved = await self._client.snapshot(self._session)
        except WorkspaceRefused as error:
            raise WorkspaceLost(error.message) from None
        except AskError as error:
            raise _infra(error, "sandbox refused the snapshot") from None
        return saved.snapshot

    async def close(self) -> None:
        # Best effort: an unclosed session is reclaimed by its lease anyway.
        with contextlib.suppress(AskError):
            await self._client.close(self._session)


def _infra(error: AskError, refused: str) -> InfraFailure:
    """Every way a request can fail without the answer asked for, as an infra failure."""
    if isinstance(error, Refused):
        return InfraFailure(f"{refused} ({error.code.value}): {error.message}")
    return sandbox_failure(error)
