"""Pull consumers: fetch, decode, handle, ack; hand back on failure; dead-letter the hopeless."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from protocol import headers as h
from protocol.codec import Codec
from protocol.errors import DecodeError, ErrorCode
from protocol.messages import task_id_of
from services.runtime.deadletter import DeadLetters, Rejection
from services.runtime.errors import Reject
from services.runtime.jetstream import ConsumerSpec, ensure_consumer
from services.runtime.logs import get_logger
from services.runtime.metrics import ServiceMetrics

M = TypeVar("M")


@dataclass(frozen=True, kw_only=True)
class ConsumerTuning:
    max_in_flight: int = 16
    #: How long one fetch waits for work; also how fast intake notices a stop.
    fetch_wait_s: float = 1.0
    #: Delay before a failed message is redelivered (grows with the delivery count).
    nak_delay_s: float = 1.0
    #: Pause after a transport error before fetching again.
    error_backoff_s: float = 0.5


@dataclass(kw_only=True)
class Delivery:
    """What a handler knows about the message besides its body."""

    subject: str
    headers: Mapping[str, str]
    trace_id: str
    num_delivered: int
    stream_seq: int
    msg: Msg = field(repr=False)

    async def in_progress(self) -> None:
        """Push the redelivery deadline back; the runtime also does this on a timer."""
        await self.msg.in_progress()


Handler = Callable[[M, Delivery], Awaitable[None]]


class Consumer(Generic[M]):
    """One durable pull consumer with bounded concurrency."""

    def __init__(
        self,
        spec: ConsumerSpec,
        codec: Codec[M],
        handler: Handler[M],
        *,
        js: JetStreamContext,
        dead_letters: DeadLetters,
        metrics: ServiceMetrics,
        tuning: ConsumerTuning,
    ) -> None:
        self.spec = spec
        self._codec = codec
        self._handler = handler
        self._js = js
        self._dead = dead_letters
        self._metrics = metrics
        self._tuning = tuning
        self._intake_open = True
        self._in_flight: set[asyncio.Task[None]] = set()
        self._slot_free = asyncio.Event()
        self._log = get_logger(consumer=spec.durable, stream=spec.stream)

    @property
    def source(self) -> str:
        return self.spec.stream

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def stop_intake(self) -> None:
        self._intake_open = False
        self._slot_free.set()

    def cancel_in_flight(self) -> int:
        for task in self._in_flight:
            task.cancel()
        return len(self._in_flight)

    async def run(self) -> None:
        await ensure_consumer(self._js, self.spec)
        sub = await self._js.pull_subscribe_bind(self.spec.durable, self.spec.stream)
        try:
            async with asyncio.TaskGroup() as group:
                while self._intake_open:
                    for msg in await self._fetch(sub):
                        self._spawn(group, msg)
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _fetch(self, sub: JetStreamContext.PullSubscription) -> list[Msg]:
        free = self._tuning.max_in_flight - len(self._in_flight)
        if free <= 0:
            self._slot_free.clear()
            await self._slot_free.wait()
            return []
        try:
            return await sub.fetch(free, timeout=self._tuning.fetch_wait_s)
        except (nats.errors.TimeoutError, TimeoutError):
            return []
        except nats.errors.Error as error:
            # Disconnected or reconnecting: nothing was taken, try again shortly.
            self._log.warning("fetch_failed", error=repr(error))
            await asyncio.sleep(self._tuning.error_backoff_s)
            return []

    def _spawn(self, group: asyncio.TaskGroup, msg: Msg) -> None:
        task = group.create_task(self._process(msg))
        self._in_flight.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._slot_free.set()

    async def _process(self, msg: Msg) -> None:
        try:
            await self._receive(msg)
        except Exception as error:
            # Transport failure while acking or dead-lettering: left unacked, so it is redelivered.
            self._log.error("delivery_failed", error=repr(error), subject=msg.subject)

    async def _receive(self, msg: Msg) -> None:
        source = self.source
        self._metrics.received.labels(source=source).inc()
        meta = msg.metadata
        if meta.num_delivered > 1:
            self._metrics.redelivered.labels(source=source).inc()
        if not self._intake_open:
            await msg.nak()
            return
        try:
            message = self._codec.decode(msg.data)
        except DecodeError as error:
            await self._reject(msg, error.code, error.message, error.field)
            return
        await self._handle(msg, message)

    async def _handle(self, msg: Msg, message: M) -> None:
        delivery = self._delivery(msg)
        source = self.source
        gauge = self._metrics.in_flight.labels(source=source)
        gauge.inc()
        started = time.perf_counter()
        try:
            with structlog.contextvars.bound_contextvars(
                trace_id=delivery.trace_id, task_id=task_id_of(message)  # type: ignore[arg-type]
            ):
                await self._run_handler(message, delivery)
            await msg.ack()
            self._metrics.acked.labels(source=source).inc()
        except asyncio.CancelledError:
            self._metrics.handled_back.labels(source=source).inc()
            await _quiet(msg.nak())
            raise
        except Reject as error:
            await self._reject(msg, error.code, error.message, error.field)
        except Exception as error:  # a handler bug must not kill the consumer
            await self._failed(msg, error)
        finally:
            gauge.dec()
            self._metrics.latency.labels(source=source).observe(time.perf_counter() - started)

    async def _run_handler(self, message: M, delivery: Delivery) -> None:
        beat = asyncio.ensure_future(self._keep_alive(delivery.msg))
        try:
            await self._handler(message, delivery)
        finally:
            beat.cancel()
            await asyncio.wait([beat])

    async def _keep_alive(self, msg: Msg) -> None:
        """In-progress acks so long work is not redelivered to someone else meanwhile."""
        interval = max(self.spec.ack_wait_s / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            await _quiet(msg.in_progress())

    async def _failed(self, msg: Msg, error: Exception) -> None:
        self._metrics.failed.labels(source=self.source).inc()
        deliveries = msg.metadata.num_delivered
        self._log.warning("handler_failed", error=repr(error), deliveries=deliveries)
        if deliveries >= self.spec.max_deliver:
            reason = f"failed {deliveries} times, last: {type(error).__name__}: {error}"
            await self._reject(msg, ErrorCode.MAX_DELIVER, reason, None)
            return
        await _quiet(msg.nak(delay=self._tuning.nak_delay_s * deliveries))

    async def _reject(self, msg: Msg, code: ErrorCode, message: str, field: str | None) -> None:
        meta = msg.metadata
        rejection = Rejection(
            code=code,
            message=message,
            field=field,
            source=self.source,
            subject=msg.subject,
            deliveries=meta.num_delivered,
            key=f"{self.source}:{meta.sequence.stream}",
        )
        self._log.warning("rejected", code=code.value, reason=message, field=field, subject=msg.subject)
        # If NATS is down this raises and the message stays unacked: it comes back, nothing is lost.
        await self._dead.reject(rejection, msg.data, msg.headers)
        await msg.ack()

    def _delivery(self, msg: Msg) -> Delivery:
        hdrs = msg.headers or {}
        return Delivery(
            subject=msg.subject,
            headers=hdrs,
            trace_id=hdrs.get(h.TRACE_ID, ""),
            num_delivered=msg.metadata.num_delivered,
            stream_seq=msg.metadata.sequence.stream,
            msg=msg,
        )


async def _quiet(action: Awaitable[None]) -> None:
    """Acks and naks are best effort: if the connection is gone the server redelivers anyway."""
    with contextlib.suppress(nats.errors.Error, TimeoutError):
        await action
