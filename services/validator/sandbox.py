"""The validator's side of the sandbox: SandboxExec over NATS request/reply.

Every way the request can fail without a SandboxResult (no sandbox service, no
answer in time, an error reply, a reply that is not a result) is an
:class:`InfraFailure` or a :class:`SandboxRejected`, never a score.
"""

from __future__ import annotations

from typing import Protocol

from nats.aio.client import Client as NATS

from protocol.errors import ErrorCode
from protocol.messages import SandboxExec, SandboxResult
from services.runtime.ask import AskError, AskTimeout, BadReply, NoResponder, Refused, Unsent
from services.sandbox.client import SandboxClient
from services.validator.base import InfraFailure


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
        self._client = SandboxClient(nc, exec_subject=subject)

    async def run(self, request: SandboxExec, timeout_s: float) -> SandboxResult:
        try:
            return await self._client.exec(request, timeout_s)
        except Refused as error:
            raise SandboxRejected(error.code, error.message) from None
        except AskError as error:
            raise sandbox_failure(error) from None


def sandbox_failure(error: AskError) -> InfraFailure:
    """A sandbox request that got no answer, or one that does not decode, as an infra failure."""
    if isinstance(error, NoResponder):
        return InfraFailure(f"no sandbox service answers on {error.subject}")
    if isinstance(error, AskTimeout):
        return InfraFailure(
            f"the sandbox did not answer within {error.timeout_s:.1f}s on {error.subject}"
        )
    if isinstance(error, BadReply):
        return InfraFailure(f"the sandbox sent an unreadable reply: {error.reason}")
    if isinstance(error, Unsent):
        return InfraFailure(f"sandbox request failed: {error.error!r}")
    return InfraFailure(str(error))
