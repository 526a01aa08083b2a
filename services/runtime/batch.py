"""Batch mode of the pull consumer: one handler call per fetch instead of one task a message.

For handlers that take microseconds (rule validators, counters), the per-message
path's task, context binding, metrics and ack cost more than the work.  A
:class:`BatchConsumer` hands a whole fetch to the handler at once and settles each
message by the outcome the handler gives for it, in order:

* ``None``: done; the message is acked.
* a :class:`~services.runtime.errors.Reject`: dead-lettered now, with the original bytes.
* any other exception: failed; nak'd with a growing delay, and dead-lettered once
  ``max_deliver`` deliveries have failed (as if the per-message handler had raised it).
* an awaitable of one of those, for a message whose work takes longer (a sandbox run):
  the others are settled at once and this one when it completes, so a slow message
  holds neither the batch's acks nor its slots.

Bytes that do not decode are dead-lettered one by one and never reach the handler.  A
handler that raises fails every message of the batch.  Otherwise as on the per-message
path: the batch is kept alive with in-progress acks while it is handled, nothing is
acked before its outcome says so (a crash loses nothing: what is unacked comes back
after ``ack_wait``), and on stop what is still being handled once the grace period ends
is handed back (nak'd).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import nats.errors
import structlog
from nats.aio.msg import Msg

from protocol import headers as h
from protocol.errors import DecodeError
from services.runtime.consumer import (
    Delivery,
    PullConsumer,
    Slots,
    delivery_of,
    quietly,
)
from services.runtime.errors import Reject

M = TypeVar("M")

#: What a batch handler says of one message: ``None`` (ack), a ``Reject`` (dead-letter),
#: or another exception (failed: nak, dead-letter after max_deliver).
Outcome = Exception | None
#: An outcome now, or one to await (settled when it completes).
Result = Outcome | Awaitable[Outcome]
BatchHandler = Callable[[list[tuple[M, Delivery]]], Awaitable[Sequence[Result]]]


def _discard(results: Sequence[Result]) -> None:
    """Close coroutines that will never be awaited (else Python warns about each)."""
    for result in results:
        if inspect.iscoroutine(result):
            result.close()


class BatchConsumer(PullConsumer[M, BatchHandler[M]]):
    """Hands each fetch (up to ``tuning.batch_size`` messages) to the handler at once."""

    def _batch_limit(self, free: int) -> int:
        size = self._tuning.batch_size
        return free if size is None else min(free, size)

    def _spawn(self, group: asyncio.TaskGroup, msgs: list[Msg]) -> None:
        slots = Slots(len(msgs))
        self._track(group.create_task(self._process(msgs, slots)), slots)

    def _settled(self, slots: Slots, count: int) -> None:
        self._free(slots, count)
        gate = self._tuning.gate
        if gate is not None:
            for _ in range(count):
                gate.finished()

    async def _process(self, msgs: list[Msg], slots: Slots) -> None:
        try:
            await self._receive(msgs, slots)
        except Exception as error:
            # Transport failure while naking: left unacked, so they are redelivered.
            self._log.error("delivery_failed", error=repr(error), messages=len(msgs))
        finally:
            self._active.pop(id(msgs), None)
            self._settled(slots, slots.left)

    async def _receive(self, msgs: list[Msg], slots: Slots) -> None:
        self._received.inc(len(msgs))
        if not self._intake_open:
            for msg in msgs:
                await quietly(msg.nak())
            return
        # Kept alive from here on; a +WPI for a message already settled is ignored.
        self._active[id(msgs)] = (msgs, time.perf_counter())
        held, items = await self._decode(msgs)
        if items:
            results = await self._handle(held, items)
            # Settling is quick; what waits longer is kept alive by _settle_later.
            self._active.pop(id(msgs), None)
            await self._settle(held, results, slots)

    async def _decode(self, msgs: list[Msg]) -> tuple[list[Msg], list[tuple[M, Delivery]]]:
        """The messages that decode, with their deliveries; the others are dead-lettered."""
        held: list[Msg] = []
        items: list[tuple[M, Delivery]] = []
        redelivered = 0
        for index, msg in enumerate(msgs):
            delivery = delivery_of(msg)
            redelivered += delivery.num_delivered > 1
            try:
                message = self._codec.decode(msg.data)
            except DecodeError as error:
                rejection = Reject(error.code, error.message, field=error.field)
                try:
                    await self._settle_quietly(msg, rejection)
                except asyncio.CancelledError:
                    # Stopped while dead-lettering: this one and the rest go back.
                    await self._hand_back_rest([*held, *msgs[index:]], [])
                    raise
                continue
            held.append(msg)
            items.append((message, delivery))
        if redelivered:
            self._redelivered.inc(redelivered)
        return held, items

    async def _handle(self, msgs: list[Msg], items: list[tuple[M, Delivery]]) -> Sequence[Result]:
        count = len(msgs)
        self._gauge.inc(count)
        started = time.perf_counter()
        try:
            return await self._results(items)
        except asyncio.CancelledError:
            self._handed_back.inc(count)
            for msg in msgs:
                await quietly(msg.nak())
            raise
        finally:
            self._gauge.dec(count)
            # One observation per batch: what one call of the handler took.
            self._latency.observe(time.perf_counter() - started)

    async def _results(self, items: list[tuple[M, Delivery]]) -> Sequence[Result]:
        try:
            results = await self._handler(items)
        except Exception as error:  # a handler bug fails the batch, not the consumer
            return [error] * len(items)
        if len(results) != len(items):
            _discard(results)
            bug = RuntimeError(f"batch handler gave {len(results)} outcomes for {len(items)}")
            return [bug] * len(items)
        return results

    async def _settle(self, msgs: list[Msg], results: Sequence[Result], slots: Slots) -> None:
        done: list[Msg] = []
        failed: list[tuple[Msg, Exception]] = []
        later: list[tuple[Msg, Awaitable[Outcome]]] = []
        for msg, result in zip(msgs, results, strict=True):
            if result is None:
                done.append(msg)
            elif isinstance(result, Exception):
                failed.append((msg, result))
            else:
                later.append((msg, result))
        await self._ack_all(done)
        self._acked.inc(len(done))
        for index, (msg, error) in enumerate(failed):
            try:
                await self._settle_quietly(msg, error)
            except asyncio.CancelledError:
                # Stopped while dead-lettering: what is not settled yet goes back.
                rest = [m for m, _ in failed[index:]] + [m for m, _ in later]
                await self._hand_back_rest(rest, [pending for _, pending in later])
                raise
        self._settled(slots, len(done) + len(failed))
        if later:
            await self._settle_later(later, slots)

    async def _ack_all(self, msgs: list[Msg]) -> None:
        """Ack every one of ``msgs`` in one write; best effort, as any ack (see Bus.ack_many)."""
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await self._bus.ack_many(msgs)

    async def _hand_back_rest(self, msgs: Sequence[Msg], results: Sequence[Result]) -> None:
        self._handed_back.inc(len(msgs))
        for msg in msgs:
            await quietly(msg.nak())
        _discard(results)

    async def _settle_later(
        self, later: list[tuple[Msg, Awaitable[Outcome]]], slots: Slots
    ) -> None:
        """Await each deferred outcome and settle it as it comes; on stop, hand back the rest."""
        waiting = [msg for msg, _ in later]
        self._active[id(waiting)] = (waiting, time.perf_counter())
        unsettled = {id(msg): msg for msg in waiting}
        try:
            async with asyncio.TaskGroup() as group:
                for msg, pending in later:
                    group.create_task(self._settle_when_done(msg, pending, slots, unsettled))
        except asyncio.CancelledError:
            await self._hand_back_rest(list(unsettled.values()), [p for _, p in later])
            raise
        finally:
            self._active.pop(id(waiting), None)

    async def _settle_when_done(
        self, msg: Msg, pending: Awaitable[Outcome], slots: Slots, unsettled: dict[int, Msg]
    ) -> None:
        # As on the per-message path, the work done for a message (logs, the requests it
        # makes, such as a validator's SandboxExec) carries the message's trace id.
        trace_id = (msg.headers or {}).get(h.TRACE_ID, "")
        try:
            with structlog.contextvars.bound_contextvars(trace_id=trace_id):
                outcome = await pending
        except Exception as error:
            outcome = error
        unsettled.pop(id(msg), None)
        if outcome is None:
            await quietly(msg.ack())
            self._acked.inc()
        else:
            await self._settle_quietly(msg, outcome)
        self._settled(slots, 1)

    async def _settle_quietly(self, msg: Msg, outcome: Exception) -> None:
        """Dead-letter or nak ``msg``; if NATS is down it stays unacked and comes back."""
        trace_id = (msg.headers or {}).get(h.TRACE_ID, "")
        try:
            with structlog.contextvars.bound_contextvars(trace_id=trace_id):
                if isinstance(outcome, Reject):
                    await self._reject(msg, outcome.code, outcome.message, outcome.field)
                else:
                    await self._failed(msg, outcome)
        except Exception as error:
            self._log.error("delivery_failed", error=repr(error), subject=msg.subject)
