"""Pull consumers: fetch, decode, handle, ack; hand back on failure; dead-letter the hopeless.

:class:`PullConsumer` owns what every pull consumer shares: the fetch loop with its
bound on messages in flight and the priority gate, in-progress keep-alive, naks with
backoff, dead letters, and the server's max-deliveries advisories.  :class:`Consumer`
handles each message in a task of its own; ``services.runtime.batch`` handles a whole
fetch at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api

from protocol import headers as h
from protocol.codec import Codec
from protocol.errors import DecodeError, ErrorCode
from protocol.messages import task_id_of
from services.runtime.bus import Bus
from services.runtime.deadletter import DeadLetters, Rejection
from services.runtime.errors import Defer, Reject
from services.runtime.jetstream import ConsumerSpec, ensure_consumer
from services.runtime.logs import get_logger
from services.runtime.metrics import ServiceMetrics
from services.runtime.priority import PriorityGate
from services.runtime.pull import Puller, PullFailed

M = TypeVar("M")
#: What a consumer's handler is: one message at a time, or a whole fetch (batch mode).
H = TypeVar("H")


def max_deliveries_advisory(stream: str, durable: str) -> str:
    """The server's own subject (not Temper's): a message ran out of deliveries."""
    return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{durable}"


class _MaxDeliveries(msgspec.Struct):
    stream_seq: int
    deliveries: int


@dataclass(frozen=True, kw_only=True)
class ConsumerTuning:
    max_in_flight: int = 16
    #: How long one fetch waits for work; also how fast intake notices a stop.
    fetch_wait_s: float = 1.0
    #: Delay before a failed message is redelivered (grows with the delivery count).
    nak_delay_s: float = 1.0
    #: Pause after a transport error before fetching again.
    error_backoff_s: float = 0.5
    #: Shared with the consumers of other priority tiers (see services.runtime.priority).
    gate: PriorityGate | None = None
    tier: int = 0
    #: Batch mode only: most messages handed to the handler at once (None: max_in_flight).
    #: Batches run concurrently up to max_in_flight messages in all; a batch is settled
    #: when its slowest message is done, so slow handlers want small batches.
    batch_size: int | None = None


@dataclass(kw_only=True, slots=True)
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


class MessageSource(Protocol):
    """Where a pull consumer's messages come from."""

    async def fetch(self, count: int, wait_s: float) -> list[Msg]: ...

    async def close(self) -> list[Msg]:
        """Stop; returns messages received but never handed out (the consumer naks them)."""
        ...


class Slots:
    """The in-flight messages one task holds, freed as they are settled or when it ends."""

    __slots__ = ("left",)

    def __init__(self, count: int) -> None:
        self.left = count


class PullConsumer(Generic[M, H]):
    """A durable pull consumer with a bound on the messages it holds at once.

    Subclasses say what becomes of a fetched batch (:meth:`_spawn`: tasks in the
    consumer's group, each registered with :meth:`_track` for the messages it holds),
    decoded with ``codec`` and handed to ``handler``.
    """

    def __init__(
        self,
        spec: ConsumerSpec,
        codec: Codec[M],
        handler: H,
        *,
        bus: Bus,
        dead_letters: DeadLetters,
        metrics: ServiceMetrics,
        tuning: ConsumerTuning,
    ) -> None:
        self.spec = spec
        self._codec = codec
        self._handler = handler
        self._bus = bus
        self._js = bus.js
        self._work_queue = False
        self._dead = dead_letters
        self._metrics = metrics
        self._tuning = tuning
        self._intake_open = True
        self._in_flight: set[asyncio.Task[None]] = set()
        #: Messages held by the tasks in flight (one each, or one batch each).
        self._holding = 0
        #: id(key) -> (messages being handled, when their redelivery deadline was last pushed).
        #: Keyed by identity: nats-py's Msg is an eq-dataclass, so it cannot be hashed itself.
        self._active: dict[int, tuple[Sequence[Msg], float]] = {}
        self._slot_free = asyncio.Event()
        #: Set once the fetch loop has ended: no pull request of ours is open any more.
        self._intake_done = asyncio.Event()
        self._log = get_logger(consumer=spec.durable, stream=spec.stream)
        # Labelled children resolved once: the label lookup costs more than the increment.
        source = spec.stream
        self._received = metrics.received.labels(source=source)
        self._redelivered = metrics.redelivered.labels(source=source)
        self._acked = metrics.acked.labels(source=source)
        self._failed_count = metrics.failed.labels(source=source)
        self._handed_back = metrics.handled_back.labels(source=source)
        self._gauge = metrics.in_flight.labels(source=source)
        self._latency = metrics.latency.labels(source=source)

    @property
    def source(self) -> str:
        return self.spec.stream

    @property
    def in_flight(self) -> int:
        """Messages being handled."""
        return self._holding

    def stop_intake(self) -> None:
        self._intake_open = False
        self._slot_free.set()
        if self._tuning.gate is not None:
            self._tuning.gate.close()

    def cancel_in_flight(self) -> int:
        """Cancel every handler (each hands its messages back); returns how many messages."""
        for task in self._in_flight:
            task.cancel()
        return self._holding

    async def hand_back(self) -> int:
        """Cancel in-flight handlers (each naks its messages) once intake has ended.

        A nak while our own pull request is still open would deliver the message straight
        back here, to be nak'd again: a wasted delivery that counts against max_deliver.
        """
        await self.intake_ended()
        return self.cancel_in_flight()

    async def intake_ended(self) -> None:
        """Returns once no message can arrive any more: its last fetch is closed."""
        await self._intake_done.wait()

    async def run(self) -> None:
        try:
            await self._consume()
        finally:
            self._intake_done.set()

    async def _open(self) -> MessageSource:
        puller = Puller(self._bus.nc, self.spec.stream, self.spec.durable)
        await puller.start()
        return puller

    def _spawn(self, group: asyncio.TaskGroup, msgs: list[Msg]) -> None:
        raise NotImplementedError

    async def _prepare(self) -> None:
        """Create (or update) the durable this consumer pulls from."""
        await ensure_consumer(self._js, self.spec)

    def _advisory_subject(self) -> str:
        return max_deliveries_advisory(self.spec.stream, self.spec.durable)

    async def _consume(self) -> None:
        await self._prepare()
        info = await self._js.stream_info(self.spec.stream)
        self._work_queue = info.config.retention == api.RetentionPolicy.WORK_QUEUE
        source = await self._open()
        advisories = await self._bus.nc.subscribe(self._advisory_subject())
        try:
            async with asyncio.TaskGroup() as group:
                keeper = group.create_task(self._keep_alive())
                exhausted = group.create_task(self._dead_letter_exhausted(advisories))
                while self._intake_open:
                    msgs = await self._fetch(source)
                    if msgs:
                        self._spawn(group, msgs)
                # Nothing more may arrive: a nak now cannot come straight back to us.
                await self._close(source)
                self._intake_done.set()
                while self._in_flight:
                    await asyncio.wait(set(self._in_flight))
                keeper.cancel()
                exhausted.cancel()
        finally:
            await self._close(source)  # again after a failure; closing twice is harmless
            with contextlib.suppress(nats.errors.Error):
                await advisories.unsubscribe()

    async def _close(self, source: MessageSource) -> None:
        for msg in await source.close():
            await quietly(msg.nak())  # received after the last fetch: nobody will handle it

    def _track(self, task: asyncio.Task[None], slots: Slots) -> None:
        """Count ``slots`` as held by ``task``; what it has not freed is freed when it ends."""
        self._holding += slots.left
        self._in_flight.add(task)
        task.add_done_callback(functools.partial(self._release, slots))

    def _release(self, slots: Slots, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._free(slots, slots.left)

    def _free(self, slots: Slots, count: int) -> None:
        slots.left -= count
        self._holding -= count
        self._slot_free.set()

    async def _fetch(self, source: MessageSource) -> list[Msg]:
        free = self._tuning.max_in_flight - self._holding
        if free <= 0:
            self._slot_free.clear()
            await self._slot_free.wait()
            return []
        gate = self._tuning.gate
        if gate is None:
            return await self._pull(source, self._batch_limit(free), self._tuning.fetch_wait_s)
        wanted = self._batch_limit(free)
        admission = await gate.admit(self._tuning.tier, wanted, self._tuning.fetch_wait_s)
        if admission.slots == 0:
            gate.fetched(self._tuning.tier, 0)
            return []
        batch: list[Msg] = []
        try:
            batch = await self._pull(source, admission.slots, admission.wait_s)
        finally:
            gate.fetched(self._tuning.tier, len(batch))
        return batch

    def _batch_limit(self, free: int) -> int:
        """How many of ``free`` slots one fetch may fill."""
        return free

    async def _pull(self, source: MessageSource, count: int, wait_s: float) -> list[Msg]:
        try:
            return await source.fetch(count, wait_s)
        except (nats.errors.TimeoutError, TimeoutError):
            return []
        except (nats.errors.Error, PullFailed) as error:
            # Disconnected or reconnecting: nothing was taken, try again shortly.
            self._log.warning("fetch_failed", error=repr(error))
            await asyncio.sleep(self._tuning.error_backoff_s)
            return []

    async def _keep_alive(self) -> None:
        """In-progress acks for long handlers, so their message is not redelivered meanwhile."""
        interval = max(self.spec.ack_wait_s / 3, 0.05)
        while True:
            await asyncio.sleep(interval / 2)
            now = time.perf_counter()
            for key, (msgs, pushed) in list(self._active.items()):
                if now - pushed >= interval and key in self._active:
                    self._active[key] = (msgs, now)
                    for msg in msgs:
                        await quietly(msg.in_progress())

    async def _failed(self, msg: Msg, error: Exception) -> None:
        self._failed_count.inc()
        deliveries = msg.metadata.num_delivered
        self._log.warning("handler_failed", error=repr(error), deliveries=deliveries)
        if deliveries >= self.spec.max_deliver:
            reason = f"failed {deliveries} times, last: {type(error).__name__}: {error}"
            await self._reject(msg, ErrorCode.MAX_DELIVER, reason, None)
            return
        await quietly(msg.nak(delay=self._tuning.nak_delay_s * deliveries))

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
        self._log.warning(
            "rejected", code=code.value, reason=message, field=field, subject=msg.subject
        )
        # If NATS is down this raises and the message stays unacked: it comes back, nothing is lost.
        await self._dead.reject(rejection, msg.data, msg.headers)
        await msg.ack()

    async def _dead_letter_exhausted(self, advisories: Subscription) -> None:
        """Dead-letter messages whose every delivery ended without an ack.

        The in-handler path covers handlers that raise.  A process that crashed, hung past
        ack_wait or was killed on the last delivery never gets to; the server then stops
        delivering and says so in an advisory.  Every instance hears it; the dead letter's
        message id makes the entry land once.
        """
        async for advisory in advisories.messages:
            try:
                await self._exhausted(msgspec.json.decode(advisory.data, type=_MaxDeliveries))
            except (msgspec.DecodeError, msgspec.ValidationError) as error:
                self._log.warning("bad_advisory", error=str(error))
            except nats.errors.Error as error:
                # Not dead-lettered this time; the message is still in its stream.
                self._log.error("exhausted_dead_letter_failed", error=repr(error))

    async def _exhausted(self, advisory: _MaxDeliveries) -> None:
        try:
            stored = await self._js.get_msg(self.spec.stream, advisory.stream_seq)
        except nats.js.errors.NotFoundError:
            return  # acked meanwhile, or another instance already moved it
        rejection = Rejection(
            code=ErrorCode.MAX_DELIVER,
            message=(
                f"not acknowledged after {advisory.deliveries} deliveries "
                "(the handler crashed, hung past ack_wait, or was stopped each time)"
            ),
            source=self.source,
            subject=stored.subject or "",
            deliveries=advisory.deliveries,
            key=f"{self.source}:{advisory.stream_seq}",
        )
        self._log.warning(
            "exhausted", stream_seq=advisory.stream_seq, deliveries=advisory.deliveries
        )
        await self._dead.reject(rejection, stored.data or b"", stored.headers)
        if self._work_queue:
            # A work queue would keep it forever: no consumer will take it again.
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await self._js.delete_msg(self.spec.stream, advisory.stream_seq)


class Consumer(PullConsumer[M, Handler[M]]):
    """Each message handled in its own task, with bounded concurrency."""

    def _spawn(self, group: asyncio.TaskGroup, msgs: list[Msg]) -> None:
        for msg in msgs:
            self._track(group.create_task(self._process(msg)), Slots(1))

    async def _process(self, msg: Msg) -> None:
        try:
            await self._receive(msg)
        except Exception as error:
            # Transport failure while acking or dead-lettering: left unacked, so it is redelivered.
            self._log.error("delivery_failed", error=repr(error), subject=msg.subject)
        finally:
            if self._tuning.gate is not None:
                self._tuning.gate.finished()

    async def _receive(self, msg: Msg) -> None:
        self._received.inc()
        delivery = delivery_of(msg)
        if delivery.num_delivered > 1:
            self._redelivered.inc()
        if not self._intake_open:
            await msg.nak()
            return
        try:
            message = self._codec.decode(msg.data)
        except DecodeError as error:
            await self._reject(msg, error.code, error.message, error.field)
            return
        await self._handle(msg, message, delivery)

    async def _handle(self, msg: Msg, message: M, delivery: Delivery) -> None:
        self._gauge.inc()
        started = time.perf_counter()
        self._active[id(msg)] = ((msg,), started)
        # Each message runs in its own task (a copy of the context), so binding needs no reset.
        task_id = task_id_of(message)  # type: ignore[arg-type]
        structlog.contextvars.bind_contextvars(trace_id=delivery.trace_id, task_id=task_id)
        try:
            await self._handler(message, delivery)
        except asyncio.CancelledError:
            self._handed_back.inc()
            await quietly(msg.nak())
            raise
        except Reject as error:
            await self._reject(msg, error.code, error.message, error.field)
        except Defer as deferred:
            self._handed_back.inc()
            await quietly(msg.nak(delay=max(deferred.delay_s, 0.0)))
        except Exception as error:  # a handler bug must not kill the consumer
            await self._failed(msg, error)
        else:
            # Outside the handler's try: a failed ack is a transport problem, not a handler
            # failure, and must not nak or dead-letter work that was done.
            self._active.pop(id(msg), None)
            await msg.ack()
            self._acked.inc()
        finally:
            self._active.pop(id(msg), None)
            self._gauge.dec()
            self._latency.observe(time.perf_counter() - started)


def ack_numbers(msg: Msg) -> tuple[int, int]:
    """(num_delivered, stream sequence) of a JetStream delivery.

    Read straight from the ack subject: nats-py's ``msg.metadata`` also builds a datetime
    and two dataclasses, which costs more than the rest of a message's bookkeeping.
    """
    tokens = msg.reply.split(".")
    # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[4]), int(tokens[5])
    meta = msg.metadata  # the longer form with a domain; raises if this is no delivery
    return meta.num_delivered, meta.sequence.stream


def delivery_of(msg: Msg) -> Delivery:
    hdrs = msg.headers or {}
    delivered, stream_seq = ack_numbers(msg)
    return Delivery(
        subject=msg.subject,
        headers=hdrs,
        trace_id=hdrs.get(h.TRACE_ID, ""),
        num_delivered=delivered,
        stream_seq=stream_seq,
        msg=msg,
    )


async def quietly(action: Awaitable[None]) -> None:
    """Acks and naks are best effort: if the connection is gone the server redelivers anyway."""
    with contextlib.suppress(nats.errors.Error, TimeoutError):
        await action
