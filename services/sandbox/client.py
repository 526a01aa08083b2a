"""The sandbox service's client: a one-shot exec, and sessions (open, exec, snapshot, close).

Typed calls over :func:`services.runtime.ask.ask`.  A call that gets no answer of the type
asked for raises an :class:`~services.runtime.ask.AskError` (``NoResponder``,
``AskTimeout``, ``BadReply``, ``Refused``, ``Unsent``): each caller maps those to its own
failure (an infrastructure failure of a rollout, a message of the CLI).
"""

from __future__ import annotations

from typing import Final, TypeVar

from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.errors import ErrorCode
from protocol.messages import (
    SandboxClose,
    SandboxExec,
    SandboxOpen,
    SandboxResult,
    SandboxSession,
    SandboxSnapshot,
    SandboxSnapshotRequest,
)
from services.runtime.ask import Refused, ask

#: Seconds a close may take; an unclosed session is reclaimed by its lease anyway.
CLOSE_TIMEOUT_S: Final = 5.0

Reply = TypeVar("Reply", SandboxResult, SandboxSession, SandboxSnapshot)


class WorkspaceRefused(Refused):
    """A snapshot refused as ``bad_request``: the request was sound, the work directory
    the session's commands left is not (it cannot be archived, or their sandbox is gone)."""


class SandboxClient:
    """Requests to the sandbox service, each within ``timeout_s`` unless told otherwise.

    ``trace_id``: the trace every request carries; None carries the trace of whatever
    work is running when the request is made.
    """

    def __init__(
        self,
        nc: NATS,
        timeout_s: float = 60.0,
        *,
        trace_id: str | None = None,
        exec_subject: str | None = None,
    ) -> None:
        self._nc = nc
        self._timeout_s = timeout_s
        self._trace_id = trace_id
        self._exec_subject = exec_subject or subjects.sandbox_exec()

    async def exec(self, request: SandboxExec, timeout_s: float | None = None) -> SandboxResult:
        """Run ``request`` once, in a fresh sandbox of any instance (no session)."""
        return await self._ask(self._exec_subject, request, SandboxResult, timeout_s)

    async def open(self, request: SandboxOpen) -> SandboxSession:
        """Open a session; its requests go to the instance that holds it."""
        return await self._ask(subjects.sandbox_session(), request, SandboxSession)

    async def run(self, session: SandboxSession, request: SandboxExec) -> SandboxResult:
        """Run ``request`` (whose ``session`` names ``session``) in the session's sandbox."""
        return await self._ask(session.subject, request, SandboxResult)

    async def snapshot(self, session: SandboxSession) -> SandboxSnapshot:
        """Archive the session's work directory durably (``SandboxOpen.snapshot`` restores
        it); :class:`WorkspaceRefused` when the work directory is what stands in the way."""
        request = SandboxSnapshotRequest(session=session.session)
        try:
            return await self._ask(session.subject, request, SandboxSnapshot)
        except Refused as error:
            if error.code is ErrorCode.BAD_REQUEST:
                raise WorkspaceRefused(error.subject, error.reply) from None
            raise

    async def close(self, session: SandboxSession) -> SandboxSession:
        """Close the session within :data:`CLOSE_TIMEOUT_S`; its state as closed."""
        request = SandboxClose(session=session.session)
        return await self._ask(session.subject, request, SandboxSession, CLOSE_TIMEOUT_S)

    async def _ask(
        self,
        subject: str,
        request: SandboxExec | SandboxOpen | SandboxSnapshotRequest | SandboxClose,
        reply_type: type[Reply],
        timeout_s: float | None = None,
    ) -> Reply:
        timeout = self._timeout_s if timeout_s is None else timeout_s
        return await ask(self._nc, subject, request, reply_type, timeout, trace_id=self._trace_id)
