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
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from protocol import headers, streams, subjects
from protocol.codec import Codec, check_size, encode
from protocol.errors import DecodeError, ErrorCode, ProtocolError, RemoteError
from protocol.messages import (
    PROTOCOL_VERSION,
    DomainList,
    DomainsRequest,
    ErrorReply,
    Heartbeat,
    Message,
    ScoredRollout,
    StackStatus,
    StatusRequest,
    Task,
)

_log = logging.getLogger(__name__)

_TASK: Final[Codec[Task]] = Codec(Task)
_SCORED: Final[Codec[ScoredRollout]] = Codec(ScoredRollout)
_HEARTBEAT: Final[Codec[Heartbeat]] = Codec(Heartbeat)
_STATUS_REPLY: Final[Codec[StackStatus | ErrorReply]] = Codec(StackStatus | ErrorReply)
_DOMAINS_REPLY: Final[Codec[DomainList | ErrorReply]] = Codec(DomainList | ErrorReply)
R = TypeVar("R", bound=Message)
T = TypeVar("T")

#: What nats-py raises when nothing captures a JetStream publish or answers a request.
_NO_ANSWER: Final = (
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.errors.TimeoutError,
)
#: Requests tried again after a reconnect: a stream that did not answer, or not yet.
_UNANSWERED: Final = (nats.js.errors.NotFoundError, *_NO_ANSWER)
#: A server-side ephemeral consumer left behind by a crashed client is removed after this.
_CONSUMER_IDLE_S: Final = 30.0
#: Bounds nats-py's forced flush of a large publish; unset, it can wait forever on a dead socket.
_FLUSH_TIMEOUT_S: Final = 10.0
_HINT: Final = "start the stack (`temper up`)"
#: How long NATS may stay out of reach before a waiting call gives up: a supervisor
#: restarts a dead nats-server with back-off, which takes seconds.
DEFAULT_RECONNECT_S: Final = 30.0
#: How often a waiting call looks whether the connection went away or came back.
_LINK_POLL_S: Final = 0.25
#: What nats-py reports while it cannot reach the server; the caller hears of it from
#: the calls that wait, once the bound is over, so it is not worth a warning each time.
_CONNECTION_TROUBLE: Final = (
    OSError,
    TimeoutError,
    nats.errors.UnexpectedEOF,
    nats.errors.StaleConnectionError,
)


class StackUnavailable(ProtocolError):
    """The Temper stack (NATS, its streams, or its control service) is not there to answer."""

    code = ErrorCode.UNAVAILABLE


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


class TemperClient:
    """Submit tasks, follow their scored rollouts, and query the stack."""

    def __init__(self, nc: NATS, *, reconnect_s: float = DEFAULT_RECONNECT_S) -> None:
        """Wrap a connected nats-py client; the TemperClient owns it from now on.

        Riding through a server restart needs a connection that reconnects for at least
        ``reconnect_s``, as the one made by :meth:`connect` does.
        """
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self._link = _Link(nc, reconnect_s)
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

        Once connected, a lost connection is tried again every ``reconnect_wait_s``; calls
        waiting on it give up with :class:`StackUnavailable` after ``reconnect_s``.
        """
        nc = NATS()
        errors = _ErrorLog()
        try:
            await asyncio.wait_for(
                nc.connect(
                    url,
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
                f"cannot reach NATS at {url} within {connect_timeout_s}s ({cause!r}); {_HINT}"
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
        subject = subjects.task(task.tier, task.domain)
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
        except _NO_ANSWER as error:
            raise StackUnavailable(
                f"no task stream captures {outgoing.subject} (the stream is missing or not "
                f"answering: {error}); {_HINT}"
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
        follower = _Follower(self._js, self._link, subjects.scored_for_task(task_id))
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
        except _UNANSWERED as error:
            raise _scored_missing(error) from error
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
                f"no {who} answered on {subject} within {timeout_s}s; {_HINT}"
            ) from error
        reply = replies.decode(msg.data)
        if isinstance(reply, ErrorReply):
            raise RemoteError(reply.code, reply.message, reply.field)
        return reply

    async def ping(self, *, timeout_s: float = 0.5) -> list[Heartbeat]:
        """Ask every service instance for a Heartbeat; return those that answer in ``timeout_s``."""
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox)
        deadline = asyncio.get_running_loop().time() + timeout_s
        beats: list[Heartbeat] = []
        try:
            await self._nc.publish(subjects.ping(), b"", reply=inbox)
            while (msg := await _next(sub, deadline)) is not None:
                try:
                    beats.append(_HEARTBEAT.decode(msg.data))
                except DecodeError as error:
                    _log.warning("ignoring a ping reply that is not a Heartbeat: %s", error)
        finally:
            await sub.unsubscribe()
        return beats


async def _next(sub: Subscription, deadline: float | None) -> Msg | None:
    """The next message, or ``None`` once ``deadline`` (loop time) has passed."""
    timeout = None
    if deadline is not None:
        timeout = deadline - asyncio.get_running_loop().time()
        if timeout <= 0:
            return None
    try:
        return await sub.next_msg(timeout=timeout)
    except nats.errors.TimeoutError:
        return None


def _decode_scored(msg: Msg) -> ScoredRollout | None:
    try:
        return _SCORED.decode(msg.data)
    except DecodeError as error:
        _log.warning("skipping an undecodable scored rollout on %s: %s", msg.subject, error)
        return None


class _Link:
    """The connection as the calls that wait on it see it: up, down since when, reconnected.

    nats-py reconnects by itself, and (made by :meth:`TemperClient.connect`) for ever;
    a waiting call gives up once NATS has been out of reach for ``reconnect_s``.  Read
    from the connection's public state, so a connection made elsewhere works too.
    """

    def __init__(self, nc: NATS, reconnect_s: float) -> None:
        url = nc.connected_url
        self.url = url.geturl() if url else "NATS"
        self.reconnect_s = reconnect_s
        self._nc = nc
        self._down_since: float | None = None

    @property
    def reconnects(self) -> int:
        """How often the connection came back so far."""
        return int(self._nc.stats["reconnects"])

    @property
    def up(self) -> bool:
        return bool(self._nc.is_connected)

    def interrupted_since(self, reconnects: int) -> bool:
        """Whether the connection is down, or went down and came back, since ``reconnects``."""
        return not self.up or self.reconnects != reconnects

    def check(self) -> None:
        """Raise :class:`StackUnavailable` once the connection has been down for the bound."""
        if self._nc.is_closed:
            raise StackUnavailable(f"the connection to NATS at {self.url} is closed")
        if self.up:
            self._down_since = None
            return
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        elif now - self._down_since >= self.reconnect_s:
            raise StackUnavailable(
                f"NATS at {self.url} unreachable for {self.reconnect_s:g}s; {_HINT}"
            )

    async def connected(self) -> None:
        """Return once the connection is up; :class:`StackUnavailable` past the bound."""
        self.check()
        while not self.up:
            await asyncio.sleep(_LINK_POLL_S)
            self.check()

    async def persist(self, attempt: Callable[[], Awaitable[T]], *, patient: bool = False) -> T:
        """``attempt()`` until it is answered, riding through reconnects.

        A request nobody answered is tried again while the connection is down, when it
        went away under the request, or at any time when ``patient`` (a server just
        restarted may not answer at once) until the bound is over; otherwise its error is
        the caller's to explain.  NATS out of reach for the bound: :class:`StackUnavailable`.
        """
        give_up = time.monotonic() + self.reconnect_s
        while True:
            await self.connected()
            reconnects = self.reconnects
            try:
                return await self._watched(attempt())
            except _UNANSWERED:
                retry = patient or self.interrupted_since(reconnects)
                if self.up and (time.monotonic() >= give_up or not retry):
                    raise
            except (nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError):
                pass  # the connection went away under it: wait for it to come back
            await asyncio.sleep(_LINK_POLL_S)

    async def _watched(self, attempt: Awaitable[T]) -> T:
        """Await ``attempt``, unless NATS is out of reach for the bound first.

        A request sent just before the server died waits for its own timeout otherwise.
        """
        work = asyncio.ensure_future(attempt)
        try:
            while not work.done():
                await asyncio.wait([work], timeout=_LINK_POLL_S)
                if not work.done():
                    self.check()
            return work.result()
        finally:
            if not work.done():
                work.cancel()
                await asyncio.wait([work])

    async def receive(self, sub: Subscription, deadline: float | None) -> Msg | None:
        """A message of ``sub`` if one comes within a poll interval and before ``deadline``.

        Waiting in short steps is what lets the caller notice a reconnect, or give up.
        """
        step = asyncio.get_running_loop().time() + _LINK_POLL_S
        try:
            msg = await _next(sub, step if deadline is None else min(step, deadline))
        except nats.errors.ConnectionClosedError:
            msg = None
        if msg is None:
            self.check()
        return msg


class _Follower:
    """An ordered consumer of the scored stream that carries on where it was after a reconnect.

    The server keeps an ordered consumer in memory only: a restarted server has lost it,
    and its subscription would wait for ever.  After each reconnect the consumer is made
    again, from the stream sequence after the last message handed out, so nothing is
    skipped and nothing repeated.
    """

    def __init__(self, js: JetStreamContext, link: _Link, filter_subject: str) -> None:
        self._js = js
        self._link = link
        self._filter = filter_subject
        self._sub: JetStreamContext.PushSubscription | None = None
        #: Stream sequence to start from; 0 for the whole stream.
        self._next_seq = 0
        self._reconnects = 0

    async def open(self, *, patient: bool) -> None:
        """Subscribe from where it was; :class:`StackUnavailable` if the stream is missing
        (after trying for the bound, when ``patient``) or NATS stays out of reach."""
        try:
            self._sub = await self._link.persist(self._subscribe, patient=patient)
        except _UNANSWERED as error:
            raise _scored_missing(error) from error

    async def _subscribe(self) -> JetStreamContext.PushSubscription:
        # A reconnect from here on may take the consumer about to be made with it.
        self._reconnects = self._link.reconnects
        resume = self._next_seq > 0
        return await self._js.subscribe(
            self._filter,
            stream=streams.SCORED.name,
            config=api.ConsumerConfig(opt_start_seq=self._next_seq if resume else None),
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if resume else api.DeliverPolicy.ALL,
            inactive_threshold=_CONSUMER_IDLE_S,
        )

    async def next(self, deadline: float | None) -> Msg | None:
        """The next message, or ``None`` once ``deadline`` (loop time) has passed."""
        loop = asyncio.get_running_loop()
        while deadline is None or loop.time() < deadline:
            if self._sub is None or self._link.reconnects != self._reconnects:
                await self.close()
                await self.open(patient=True)
            assert self._sub is not None
            msg = await self._link.receive(self._sub, deadline)
            if msg is not None:
                self._next_seq = msg.metadata.sequence.stream + 1
                return msg
        return None

    async def close(self) -> None:
        """Unsubscribe and delete the consumer (best effort: the server drops it when idle)."""
        sub, self._sub = self._sub, None
        if sub is None:
            return
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
        # nats-py keeps the (possibly recreated) ordered consumer's name only here.
        consumer: str | None = getattr(sub, "_consumer", None)
        if consumer and self._link.up:
            with contextlib.suppress(nats.errors.Error):
                await self._js.delete_consumer(streams.SCORED.name, consumer)


def _scored_missing(error: Exception) -> StackUnavailable:
    return StackUnavailable(f"stream {streams.SCORED.name} is missing ({error}); {_HINT}")


class _ErrorLog:
    """Feeds nats-py's error callback: quiet while connecting (the caller gets the error),
    and about a lost connection (the calls that wait on it report it, past their bound)."""

    def __init__(self) -> None:
        self.last: Exception | None = None
        self.connected = False

    async def callback(self, error: Exception) -> None:
        self.last = error
        loud = self.connected and not isinstance(error, _CONNECTION_TROUBLE)
        _log.log(logging.WARNING if loud else logging.DEBUG, "nats: %r", error)
