"""The validator's side of the sandbox: SandboxExec over NATS request/reply.

Every way the request can fail without a SandboxResult (no sandbox service, no
answer in time, an error reply, a reply that is not a result) is an
:class:`InfraFailure` or a :class:`SandboxRejected`, never a score.
"""

from __future__ import annotations

from typing import Final, Protocol

import nats.errors
import structlog
from nats.aio.client import Client as NATS

from protocol import headers
from protocol.codec import Codec, encode
from protocol.errors import DecodeError, ErrorCode
from protocol.messages import ErrorReply, SandboxExec, SandboxResult
from services.validator.base import InfraFailure

_REPLIES: Final[Codec[SandboxResult | ErrorReply]] = Codec(SandboxResult | ErrorReply)


class SandboxRejected(Exception):
    """The sandbox service answered with an ErrorReply (bad request, too large, unavailable)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"sandbox refused the request ({code.value}): {message}")
        self.code = code
        self.message = message


class Sandbox(Protocol):
    """Runs one SandboxExec; tests substitute fakes at this boundary."""

    async def run(self, request: SandboxExec, timeout_s: float) -> SandboxResult: ...


class NatsSandbox:
    """SandboxExec by request/reply on the sandbox subject (queue group: any instance)."""

    def __init__(self, nc: NATS, subject: str) -> None:
        self._nc = nc
        self._subject = subject

    async def run(self, request: SandboxExec, timeout_s: float) -> SandboxResult:
        try:
            reply = await self._nc.request(
                self._subject, encode(request), timeout=timeout_s, headers=_trace_headers()
            )
        except nats.errors.NoRespondersError:
            raise InfraFailure(f"no sandbox service answers on {self._subject}") from None
        except (nats.errors.TimeoutError, TimeoutError):
            raise InfraFailure(f"the sandbox did not answer within {timeout_s:.1f}s") from None
        except nats.errors.Error as error:
            raise InfraFailure(f"sandbox request failed: {error!r}") from None
        try:
            answer = _REPLIES.decode(reply.data)
        except DecodeError as error:
            raise InfraFailure(f"the sandbox sent an unreadable reply: {error.message}") from None
        if isinstance(answer, ErrorReply):
            raise SandboxRejected(answer.code, answer.message)
        return answer


def _trace_headers() -> dict[str, str]:
    # The runtime binds the rollout's trace id per message; sandbox work for it carries it on.
    trace_id = structlog.contextvars.get_contextvars().get("trace_id")
    return {headers.TRACE_ID: str(trace_id)} if trace_id else {}
