"""Request/reply calls on the stack's control subjects: status, domains, ping, domain control.

Part of :class:`protocol.client.TemperClient`, kept here so that each file reads at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final, TypeVar

import nats.errors
from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.client.link import HINT, StackUnavailable, next_msg
from protocol.codec import Codec, encode
from protocol.errors import DecodeError, RemoteError
from protocol.messages import (
    DomainControl,
    DomainList,
    DomainSchedules,
    DomainsRequest,
    ErrorReply,
    Heartbeat,
    Message,
    StackStatus,
    StatusRequest,
)

_log = logging.getLogger("protocol.client")

_HEARTBEAT: Final[Codec[Heartbeat]] = Codec(Heartbeat)
_STATUS_REPLY: Final[Codec[StackStatus | ErrorReply]] = Codec(StackStatus | ErrorReply)
_DOMAINS_REPLY: Final[Codec[DomainList | ErrorReply]] = Codec(DomainList | ErrorReply)
_SCHEDULES: Final[Codec[DomainSchedules]] = Codec(DomainSchedules)
R = TypeVar("R", bound=Message)


class ControlCalls:
    """The stack's request/reply calls, on the connection ``_nc``."""

    _nc: NATS

    async def status(self, *, timeout_s: float = 2.0) -> StackStatus:
        """Ask the control service for the stack's status; :class:`RemoteError` if it refuses."""
        return await self._ask(
            subjects.status(), StatusRequest(), _STATUS_REPLY, "control service", timeout_s
        )

    async def domains(
        self, names: Sequence[str] = (), *, examples: bool = False, timeout_s: float = 30.0
    ) -> DomainList:
        """Ask a validator for the served domains (all, or ``names``), with example tasks if asked.

        The first answer of a validator instance counts held-out problems, hence the long default.
        """
        request = DomainsRequest(names=list(names), examples=examples)
        return await self._ask(subjects.domains(), request, _DOMAINS_REPLY, "validator", timeout_s)

    async def _ask(
        self,
        subject: str,
        request: Message,
        replies: Codec[R | ErrorReply],
        who: str,
        timeout_s: float,
    ) -> R:
        """One request/reply; :class:`StackUnavailable` if nobody answers, :class:`RemoteError`."""
        try:
            msg = await self._nc.request(subject, encode(request), timeout=timeout_s)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as error:
            raise StackUnavailable(
                f"no {who} answered on {subject} within {timeout_s}s; {HINT}"
            ) from error
        reply = replies.decode(msg.data)
        if isinstance(reply, ErrorReply):
            raise RemoteError(reply.code, reply.message, reply.field)
        return reply

    async def ping(self, *, timeout_s: float = 0.5) -> list[Heartbeat]:
        """Ask every service instance for a Heartbeat; return those that answer in ``timeout_s``."""
        return await self._gather(subjects.ping(), b"", _HEARTBEAT, timeout_s)

    async def domain_control(
        self, request: DomainControl | None = None, *, timeout_s: float = 1.0
    ) -> list[DomainSchedules]:
        """Send a DomainControl to every generator (none: only ask); their answers within
        ``timeout_s``, one per instance."""
        body = encode(request or DomainControl())
        return await self._gather(subjects.domain_control(), body, _SCHEDULES, timeout_s)

    async def _gather(
        self, subject: str, body: bytes, codec: Codec[R], timeout_s: float
    ) -> list[R]:
        """Every answer to one request that arrives within ``timeout_s``."""
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox)
        deadline = asyncio.get_running_loop().time() + timeout_s
        answers: list[R] = []
        try:
            await self._nc.publish(subject, body, reply=inbox)
            while (msg := await next_msg(sub, deadline)) is not None:
                try:
                    answers.append(codec.decode(msg.data))
                except DecodeError as error:
                    _log.warning("ignoring an undecodable reply on %s: %s", subject, error)
        finally:
            await sub.unsubscribe()
        return answers
