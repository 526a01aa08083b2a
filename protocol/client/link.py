"""How the client keeps its conversation with NATS going through a restart of the server.

nats-py reconnects by itself; what it leaves to its caller is knowing when to give up, a
request or publish caught by the restart, and an ordered consumer that the restarted
server has lost.  :class:`Link` answers the first two, :class:`Follower` the third.
Only nats-py and the protocol package are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from protocol import streams
from protocol.errors import ErrorCode, ProtocolError

_log = logging.getLogger("protocol.client")
T = TypeVar("T")

#: What nats-py raises when nothing captures a JetStream publish or answers a request.
NO_ANSWER: Final = (
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.errors.TimeoutError,
)
#: Requests tried again after a reconnect: a stream that did not answer, or not yet.
UNANSWERED: Final = (nats.js.errors.NotFoundError, *NO_ANSWER)
#: A server-side ephemeral consumer left behind by a crashed client is removed after this.
_CONSUMER_IDLE_S: Final = 30.0
HINT: Final = "start the stack (`temper up`)"
#: nats-server's error code for a consumer refused because the stream (or account) has as
#: many consumers as it allows.
MAX_CONSUMERS_CODE: Final = 10026
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


class ConsumerRefused(StackUnavailable):
    """The scored stream refused the consumer that would follow results; ``limit`` when
    it already has as many consumers as the server allows."""

    def __init__(self, message: str, *, err_code: int | None, limit: bool) -> None:
        super().__init__(message)
        self.err_code = err_code
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Start:
    """Where a consumer of the scored stream begins: by default its first message."""

    #: The first stream sequence to deliver; 0: the stream's first.
    seq: int = 0
    #: Or the first message stored at or after this time (the server's clock).
    time: datetime | None = None


async def next_msg(sub: Subscription, deadline: float | None) -> Msg | None:
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


class Link:
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
                f"NATS at {self.url} unreachable for {self.reconnect_s:g}s; {HINT}"
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
            except UNANSWERED:
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
            msg = await next_msg(sub, step if deadline is None else min(step, deadline))
        except nats.errors.ConnectionClosedError:
            msg = None
        if msg is None:
            self.check()
        return msg


class Follower:
    """An ordered consumer of the scored stream that carries on where it was after a reconnect.

    The server keeps an ordered consumer in memory only: a restarted server has lost it,
    and its subscription would wait for ever.  After each reconnect the consumer is made
    again, from the stream sequence after the last message handed out, so nothing is
    skipped and nothing repeated.  One consumer serves any number of ``filters``.
    """

    def __init__(
        self, js: JetStreamContext, link: Link, filters: Sequence[str], start: Start = Start()
    ) -> None:
        if not filters:
            raise ValueError("a follower needs at least one filter subject")
        self._js = js
        self._link = link
        self._filters = tuple(filters)
        self._start = start
        self._sub: JetStreamContext.PushSubscription | None = None
        #: Stream sequence to go on from after a reconnect; 0 until a message was handed out.
        self._next_seq = 0
        self._reconnects = 0

    async def open(self, *, patient: bool) -> None:
        """Subscribe from where it was; :class:`StackUnavailable` if the stream is missing
        (after trying for the bound, when ``patient``) or NATS stays out of reach, and
        :class:`ConsumerRefused` if the stream refuses the consumer."""
        try:
            self._sub = await self._link.persist(self._subscribe, patient=patient)
        except UNANSWERED as error:
            raise scored_missing(error) from error
        except nats.js.errors.BadRequestError as error:
            raise consumer_refused(error) from error

    async def _subscribe(self) -> JetStreamContext.PushSubscription:
        # A reconnect from here on may take the consumer about to be made with it.
        self._reconnects = self._link.reconnects
        policy, config = self._position()
        many = len(self._filters) > 1
        config.filter_subjects = list(self._filters) if many else None
        return await self._js.subscribe(
            "" if many else self._filters[0],
            stream=streams.SCORED.name,
            config=config,
            ordered_consumer=True,
            deliver_policy=policy,
            inactive_threshold=_CONSUMER_IDLE_S,
        )

    def _position(self) -> tuple[api.DeliverPolicy, api.ConsumerConfig]:
        """Where the consumer (made again) starts: after the last message handed out, else
        at the follower's start."""
        seq = self._next_seq or self._start.seq
        if seq > 0:
            return api.DeliverPolicy.BY_START_SEQUENCE, api.ConsumerConfig(opt_start_seq=seq)
        if self._start.time is not None:
            config = api.ConsumerConfig(opt_start_time=self._start.time)
            return api.DeliverPolicy.BY_START_TIME, config
        return api.DeliverPolicy.ALL, api.ConsumerConfig()

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


def scored_missing(error: Exception) -> StackUnavailable:
    return StackUnavailable(f"stream {streams.SCORED.name} is missing ({error}); {HINT}")


def consumer_refused(error: nats.js.errors.BadRequestError) -> ConsumerRefused:
    """The server's refusal of a consumer, explained: which limit, and what to do."""
    said = f"{error.description or 'refused'} (NATS error {error.err_code})"
    name = streams.SCORED.name
    if error.err_code == MAX_CONSUMERS_CODE:
        return ConsumerRefused(
            f"{name} has as many consumers as the NATS server allows ({said}): other "
            "clients are following results on it.  A wait needs one consumer: try again once "
            f"some have finished, or raise the limit ({name}'s max_consumers; a stream that "
            "sets none gets the server's default, 1,000 on nats-server 2.15)",
            err_code=error.err_code,
            limit=True,
        )
    return ConsumerRefused(
        f"{name} refused a consumer to follow results: {said}",
        err_code=error.err_code,
        limit=False,
    )


class ErrorLog:
    """Feeds nats-py's error callback: quiet while connecting (the caller gets the error),
    and about a lost connection (the calls that wait on it report it, past their bound)."""

    def __init__(self) -> None:
        self.last: Exception | None = None
        self.connected = False

    async def callback(self, error: Exception) -> None:
        self.last = error
        loud = self.connected and not isinstance(error, _CONNECTION_TROUBLE)
        _log.log(logging.WARNING if loud else logging.DEBUG, "nats: %r", error)
