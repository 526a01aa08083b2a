"""The async client a user program uses to submit tasks and follow their results.

::

    async with await TemperClient.connect("nats://127.0.0.1:4222") as client:
        receipt = await client.submit(task)
        results = await client.wait_scored(task.id, count=task.n)

The client rides through a restart of nats-server: nats-py reconnects by itself, a
result stream is followed on from where it was, and a publish is tried again (the
``Nats-Msg-Id`` makes that harmless).  Once NATS has been out of reach for
``reconnect_s`` a waiting call raises :class:`StackUnavailable` instead.

Only nats-py and the protocol package are used: no service code, no ML framework.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from protocol import headers, streams, subjects
from protocol.client.link import (
    DEFAULT_RECONNECT_S,
    HINT,
    NO_ANSWER,
    UNANSWERED,
    ErrorLog,
    Follower,
    Link,
    StackUnavailable,
    next_msg,
    scored_missing,
)
from protocol.codec import Codec, check_size, encode
from protocol.errors import DecodeError, RemoteError
from protocol.messages import (
    PROTOCOL_VERSION,
    DomainControl,
    DomainList,
    DomainSchedules,
    DomainsRequest,
    ErrorReply,
    Heartbeat,
    Message,
    ScoredRollout,
    StackStatus,
    StatusRequest,
    Task,
)
from protocol.servers import server_list

_log = logging.getLogger(__name__)

_TASK: Final[Codec[Task]] = Codec(Task)
_SCORED: Final[Codec[ScoredRollout]] = Codec(ScoredRollout)
_HEARTBEAT: Final[Codec[Heartbeat]] = Codec(Heartbeat)
_STATUS_REPLY: Final[Codec[StackStatus | ErrorReply]] = Codec(StackStatus | ErrorReply)
_DOMAINS_REPLY: Final[Codec[DomainList | ErrorReply]] = Codec(DomainList | ErrorReply)
_SCHEDULES: Final[Codec[DomainSchedules]] = Codec(DomainSchedules)
R = TypeVar("R", bound=Message)

#: Bounds nats-py's forced flush of a large publish; unset, it can wait forever on a dead socket.
_FLUSH_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class Receipt:
    """What JetStream acknowledged for one submitted task (not a wire message)."""

    task_id: str
    trace_id: str
    stream: str
    seq: int
    #: The stream already held this ``Nats-Msg-Id``: nothing new was stored.
    duplicate: bool


@dataclass(frozen=True, slots=True)
class _Outgoing:
    task_id: str
    trace_id: str
    subject: str
    payload: bytes
    headers: dict[str, str]


__all__ = ["DEFAULT_RECONNECT_S", "Receipt", "StackUnavailable", "TemperClient"]


class TemperClient:
    """Submit tasks, follow their scored rollouts, and query the stack."""

    def __init__(self, nc: NATS, *, reconnect_s: float = DEFAULT_RECONNECT_S) -> None:
        """Wrap a connected nats-py client; the TemperClient owns it from now on.

        Riding through a server restart needs a connection that reconnects for at least
        ``reconnect_s``, as the one made by :meth:`connect` does.
        """
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self._link = Link(nc, reconnect_s)
        self._closed = False

    @classmethod
    async def connect(
        cls,
        url: str = "nats://127.0.0.1:4222",
        *,
        name: str = "temper-client",
        connect_timeout_s: float = 5.0,
        reconnect_s: float = DEFAULT_RECONNECT_S,
        reconnect_wait_s: float = 0.5,
    ) -> TemperClient:
        """Connect to NATS at ``url``; raise :class:`StackUnavailable` if it cannot be reached.

        ``url`` may name every server of a cluster, comma-separated: the client fails over.

        Once connected, a lost connection is tried again every ``reconnect_wait_s``; calls
        waiting on it give up with :class:`StackUnavailable` after ``reconnect_s``.
        """
        nc = NATS()
        errors = ErrorLog()
        try:
            await asyncio.wait_for(
                nc.connect(
                    server_list(url),
                    name=name,
                    connect_timeout=max(1, math.ceil(connect_timeout_s)),
                    error_cb=errors.callback,
                    flush_timeout=_FLUSH_TIMEOUT_S,
                    # For ever: the calls that wait bound it, and only while they wait.
                    max_reconnect_attempts=-1,
                    # Typed int by nats-py, but only ever slept on: fractions work.
                    reconnect_time_wait=reconnect_wait_s,  # type: ignore[arg-type]
                ),
                connect_timeout_s,
            )
        except (OSError, nats.errors.Error, TimeoutError) as error:
            with contextlib.suppress(nats.errors.Error, AssertionError):
                await nc.close()  # nats-py asserts if connect never got far enough
            cause = errors.last or error
            raise StackUnavailable(
                f"cannot reach NATS at {url} within {connect_timeout_s}s ({cause!r}); {HINT}"
            ) from error
        errors.connected = True
        return cls(nc, reconnect_s=reconnect_s)

    @property
    def nc(self) -> NATS:
        """The underlying nats-py connection."""
        return self._nc

    async def close(self) -> None:
        """Drain and close the connection; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._nc.is_closed:
            return
        try:
            await self._nc.drain()
        except nats.errors.Error:
            await self._nc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ----------------------------------------------------------------- tasks

    async def submit(
        self,
        task: Task,
        *,
        trace_id: str | None = None,
        msg_id: str | None = None,
        timeout_s: float = 5.0,
    ) -> Receipt:
        """Publish ``task`` to its tier's stream.

        The default ``Nats-Msg-Id`` is ``task:<id>:<attempt>``, so submitting the
        same task twice stores it once (``Receipt.duplicate``).  Raises
        :class:`~protocol.errors.DecodeError` for an invalid task,
        :class:`~protocol.errors.PayloadTooLarge`, or :class:`StackUnavailable`.
        """
        outgoing = self._prepare(task, trace_id, msg_id)
        return await self._publish(outgoing, timeout_s)

    async def submit_many(
        self, tasks: Iterable[Task], *, concurrency: int = 64, timeout_s: float = 5.0
    ) -> list[Receipt]:
        """Submit tasks concurrently (at most ``concurrency`` in flight); receipts in input order.

        Every task is checked before any is published.  If a publish fails, the
        others still complete and the first error is raised; submitting the same
        list again is safe (deduplicated).
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        batch = [self._prepare(task, None, None) for task in tasks]
        gate = asyncio.Semaphore(concurrency)

        async def one(outgoing: _Outgoing) -> Receipt:
            async with gate:
                return await self._publish(outgoing, timeout_s)

        results = await asyncio.gather(*(one(o) for o in batch), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [r for r in results if isinstance(r, Receipt)]

    def _prepare(self, task: Task, trace_id: str | None, msg_id: str | None) -> _Outgoing:
        subject = subjects.of_task(task)
        payload = _TASK.encode(task)
        _TASK.decode(payload)  # Enforce the schema's constraints before a service has to reject it.
        trace = headers.clean(trace_id or headers.new_trace_id())
        hdrs = {
            headers.MSG_ID: headers.clean(msg_id or f"task:{task.id}:{task.attempt}"),
            headers.TRACE_ID: trace,
            headers.VERSION: str(PROTOCOL_VERSION),
        }
        check_size(payload, hdrs, self._nc.max_payload)
        return _Outgoing(task.id, trace, subject, payload, hdrs)

    async def _publish(self, outgoing: _Outgoing, timeout_s: float) -> Receipt:
        """Publish until the stream answers, again after a reconnect (deduplicated by id)."""

        def attempt() -> Awaitable[api.PubAck]:
            return self._js.publish(
                outgoing.subject,
                outgoing.payload,
                timeout=timeout_s,
                headers=dict(outgoing.headers),
            )

        try:
            ack = await self._link.persist(attempt)
        except NO_ANSWER as error:
            raise StackUnavailable(
                f"no task stream captures {outgoing.subject} (the stream is missing or not "
                f"answering: {error}); {HINT}"
            ) from error
        return Receipt(
            task_id=outgoing.task_id,
            trace_id=outgoing.trace_id,
            stream=ack.stream,
            seq=ack.seq,
            duplicate=bool(ack.duplicate),
        )

    # ----------------------------------------------------------------- results

    async def scored(
        self, task_id: str, *, timeout_s: float | None = None
    ) -> AsyncGenerator[ScoredRollout, None]:
        """Yield the task's scored rollouts, stored ones first, then new ones as they arrive.

        Stops after ``timeout_s`` (``None``: never).  Messages that do not decode
        are logged and skipped.  Through a server restart it carries on after the last
        one yielded; :class:`StackUnavailable` once NATS has been out of reach for the
        client's ``reconnect_s``.  Close the iterator (``contextlib.aclosing``) when
        leaving early, so its consumer is deleted at once.
        """
        follower = Follower(self._js, self._link, subjects.scored_for_task(task_id))
        await follower.open(patient=False)
        deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        try:
            while (msg := await follower.next(deadline)) is not None:
                rollout = _decode_scored(msg)
                if rollout is not None:
                    yield rollout
        finally:
            await follower.close()

    async def wait_scored(
        self, task_id: str, count: int, *, timeout_s: float = 60.0
    ) -> list[ScoredRollout]:
        """Collect ``count`` distinct scored rollouts (by id) of the task, else ``TimeoutError``."""
        if count <= 0:
            return []
        seen: dict[str, ScoredRollout] = {}
        async with contextlib.aclosing(self.scored(task_id, timeout_s=timeout_s)) as results:
            async for rollout in results:
                seen.setdefault(rollout.id, rollout)
                if len(seen) >= count:
                    return list(seen.values())
        raise TimeoutError(
            f"{len(seen)} of {count} scored rollouts of task {task_id!r} "
            f"arrived within {timeout_s}s"
        )

    async def task_progress(self, task_id: str) -> int:
        """Scored rollout messages stored for the task (a rollout scored twice counts twice)."""
        filter_ = subjects.scored_for_task(task_id)
        try:
            info = await self._js.stream_info(streams.SCORED.name, subjects_filter=filter_)
        except UNANSWERED as error:
            raise scored_missing(error) from error
        return sum((info.state.subjects or {}).values())

    async def messages(self, subject: str) -> AsyncGenerator[Msg, None]:
        """Every message published on ``subject`` (wildcards allowed) from now on, as received.

        Core NATS: what is published while the connection is down never arrives; nats-py
        subscribes again once it is back.  Raises :class:`StackUnavailable` once NATS has
        been out of reach for the client's ``reconnect_s``.
        """
        sub = await self._nc.subscribe(subject)
        try:
            while True:
                msg = await self._link.receive(sub, None)
                if msg is not None:
                    yield msg
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    # ----------------------------------------------------------------- control

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


def _decode_scored(msg: Msg) -> ScoredRollout | None:
    try:
        return _SCORED.decode(msg.data)
    except DecodeError as error:
        _log.warning("skipping an undecodable scored rollout on %s: %s", msg.subject, error)
        return None
