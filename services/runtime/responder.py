"""Request/reply handlers: typed replies, typed errors, never a crash."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from protocol import headers as h
from protocol.codec import encode
from protocol.errors import DecodeError, ErrorCode
from protocol.messages import ErrorReply, Message
from services.runtime.bus import Bus
from services.runtime.deadletter import DeadLetters, Rejection
from services.runtime.errors import RequestRejected
from services.runtime.logs import get_logger
from services.runtime.metrics import ServiceMetrics

Q = TypeVar("Q")
Q_co = TypeVar("Q_co", covariant=True)


class Decoder(Protocol[Q_co]):
    """Anything with ``decode(bytes)``: a :class:`protocol.Codec`, or a payload-ignoring stub."""

    def decode(self, data: bytes) -> Q_co: ...


@dataclass(kw_only=True)
class Request:
    subject: str
    headers: Mapping[str, str]
    trace_id: str
    msg: Msg = field(repr=False)


#: Returns the reply; ``None`` for subjects that carry events rather than requests.
RequestHandler = Callable[[Q, Request], Awaitable[Message | None]]


class Responder(Generic[Q]):
    """Serves one request subject, in a queue group so instances share the load.

    An ``observer`` watches a subject whose messages another service consumes from a
    stream: it never replies (the publisher's reply inbox waits for the stream's ack),
    and bad input is only logged and counted here, since that consumer dead-letters it.
    """

    def __init__(
        self,
        subject: str,
        codec: Decoder[Q],
        handler: RequestHandler[Q],
        *,
        queue: str | None,
        source: str,
        bus: Bus,
        dead_letters: DeadLetters,
        metrics: ServiceMetrics,
        max_in_flight: int = 64,
        observer: bool = False,
    ) -> None:
        self.subject = subject
        self._observer = observer
        self._codec = codec
        self._handler = handler
        self._queue = queue
        self._source = source
        self._bus = bus
        self._dead = dead_letters
        # Labelled once: a labels() lookup per request costs as much as the count itself.
        self._received = metrics.received.labels(source=source)
        self._acked = metrics.acked.labels(source=source)
        self._failed = metrics.failed.labels(source=source)
        self._latency = metrics.latency.labels(source=source)
        self._limit = asyncio.Semaphore(max_in_flight)
        self._sub: Subscription | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._log = get_logger(subject=subject)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def subscribe(self) -> None:
        self._sub = await self._bus.nc.subscribe(self.subject, queue=self._queue or "")

    async def stop_intake(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()

    def cancel_in_flight(self) -> int:
        for task in self._in_flight:
            task.cancel()
        return len(self._in_flight)

    async def run(self) -> None:
        if self._sub is None:
            await self.subscribe()
        assert self._sub is not None
        async with asyncio.TaskGroup() as group:
            async for msg in self._sub.messages:
                await self._limit.acquire()
                task = group.create_task(self._serve(msg))
                self._in_flight.add(task)
                task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._limit.release()

    async def _serve(self, msg: Msg) -> None:
        self._received.inc()
        trace_id = (msg.headers or {}).get(h.TRACE_ID, "")
        started = time.perf_counter()
        try:
            with structlog.contextvars.bound_contextvars(trace_id=trace_id):
                reply = await self._answer(msg, trace_id)
            if msg.reply and reply is not None and not self._observer:
                await msg.respond(encode(reply))
        except Exception as error:
            self._log.error("reply_failed", error=repr(error))
        finally:
            self._latency.observe(time.perf_counter() - started)

    async def _answer(self, msg: Msg, trace_id: str) -> Message | None:
        try:
            request = self._codec.decode(msg.data)
        except DecodeError as error:
            await self._bad_input(msg, error.code, error.message, error.field, trace_id)
            return ErrorReply(code=error.code, message=error.message, field=error.field)
        ctx = Request(subject=msg.subject, headers=msg.headers or {}, trace_id=trace_id, msg=msg)
        try:
            reply = await self._handler(request, ctx)
        except RequestRejected as error:
            self._failed.inc()
            return ErrorReply(code=error.code, message=error.message, field=error.field)
        except Exception as error:
            self._failed.inc()
            self._log.exception("handler_failed")
            return ErrorReply(code=ErrorCode.INTERNAL, message=f"{type(error).__name__}: {error}")
        self._acked.inc()
        return reply

    async def _bad_input(
        self, msg: Msg, code: ErrorCode, message: str, field: str | None, trace_id: str
    ) -> None:
        rejection = Rejection(
            code=code, message=message, field=field, source=self._source, subject=msg.subject
        )
        self._log.warning("bad_request", code=code.value, reason=message, field=field)
        if self._observer:
            self._dead.count(rejection)
            return
        try:
            # Like bad stream input: an error event, and a dead letter with the original bytes.
            await self._dead.reject(rejection, msg.data, msg.headers)
        except Exception as error:  # the reply still goes out even if the event cannot
            self._log.error("error_event_failed", error=repr(error))
