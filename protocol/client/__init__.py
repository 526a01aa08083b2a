"""The async client a user program uses to submit tasks and follow their results.

::

    async with await TemperClient.connect("nats://127.0.0.1:4222") as client:
        receipt = await client.submit(task)
        results = await client.wait_scored(task.id, count=task.n)

        # Many tasks: one consumer follows them all.
        submission = await client.submit_all(tasks)
        by_task = await client.wait_all(submission, timeout_s=600)

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
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from protocol import headers, streams, subjects
from protocol.client.control import ControlCalls
from protocol.client.link import (
    DEFAULT_RECONNECT_S,
    HINT,
    NO_ANSWER,
    UNANSWERED,
    ConsumerRefused,
    ErrorLog,
    Follower,
    Link,
    StackUnavailable,
    scored_missing,
)
from protocol.client.submission import Progress, Receipt, Submission, Tally, follow_plan
from protocol.codec import Codec, check_size
from protocol.errors import DecodeError
from protocol.messages import PROTOCOL_VERSION, ScoredRollout, Task
from protocol.servers import server_list

_log = logging.getLogger(__name__)

_TASK: Final[Codec[Task]] = Codec(Task)
_SCORED: Final[Codec[ScoredRollout]] = Codec(ScoredRollout)

#: Bounds nats-py's forced flush of a large publish; unset, it can wait forever on a dead socket.
_FLUSH_TIMEOUT_S: Final = 10.0


def task_msg_id(task: Task) -> str:
    """A submitted task's ``Nats-Msg-Id`` (docs/protocol.md §7): a publish tried again
    is stored once, and only a new ``attempt`` is stored (and run) again."""
    return f"task:{task.id}:{task.attempt}"


@dataclass(frozen=True, slots=True)
class _Outgoing:
    task_id: str
    trace_id: str
    subject: str
    payload: bytes
    headers: dict[str, str]


#: Called with each new result of a submission and how far the submission is.
ResultCallback = Callable[[ScoredRollout, Progress], None]

__all__ = [
    "DEFAULT_RECONNECT_S",
    "ConsumerRefused",
    "Progress",
    "Receipt",
    "StackUnavailable",
    "Submission",
    "TemperClient",
    "task_msg_id",
]


class TemperClient(ControlCalls):
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
            await self._close_lost()

    async def _close_lost(self) -> None:
        """Close a connection that cannot drain (reconnecting, or its server gone).

        nats-py flushes its pending buffer into the socket on close; when the server has
        just died that socket is already shut and the flush raises (``ConnectionResetError``
        on asyncio's streams, ``RuntimeError`` on uvloop's). The connection is closed either
        way, and the caller's own error is the one to report.
        """
        try:
            await self._nc.close()
        except (OSError, RuntimeError):
            pass

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

    async def submit_all(
        self, tasks: Iterable[Task], *, concurrency: int = 64, timeout_s: float = 5.0
    ) -> Submission:
        """:meth:`submit_many`, noting first where the scored stream stands, so that
        :meth:`wait_all` can follow the results of every task with one consumer.

        :class:`StackUnavailable` before anything is published if the scored stream is missing.
        """
        batch = tuple(tasks)
        scored_seq = await self._scored_seq()
        started_at = time.time()
        receipts = await self.submit_many(batch, concurrency=concurrency, timeout_s=timeout_s)
        return Submission(batch, tuple(receipts), scored_seq, started_at)

    async def _scored_seq(self) -> int:
        try:
            info = await self._link.persist(lambda: self._js.stream_info(streams.SCORED.name))
        except UNANSWERED as error:
            raise scored_missing(error) from error
        return int(info.state.last_seq)

    def _prepare(self, task: Task, trace_id: str | None, msg_id: str | None) -> _Outgoing:
        subject = subjects.of_task(task)
        payload = _TASK.encode(task)
        _TASK.decode(payload)  # Enforce the schema's constraints before a service has to reject it.
        trace = headers.clean(trace_id or headers.new_trace_id())
        hdrs = {
            headers.MSG_ID: headers.clean(msg_id or task_msg_id(task)),
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
        follower = Follower(self._js, self._link, [subjects.scored_for_task(task_id)])
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

    async def wait_all(
        self,
        submission: Submission,
        *,
        timeout_s: float = 60.0,
        on_result: ResultCallback | None = None,
    ) -> dict[str, list[ScoredRollout]]:
        """Wait until every task of ``submission`` has a scored rollout for each of its
        samples; their results by task id, else ``TimeoutError`` saying what is missing.

        One consumer follows the whole submission, however many tasks it has (see
        :mod:`protocol.client.submission`); ``on_result`` sees each new result as it
        arrives.  :class:`ConsumerRefused` if the scored stream allows no more consumers;
        through a server restart it carries on as :meth:`scored` does.
        """
        tally = Tally(submission.tasks)
        plan = follow_plan(submission)
        follower = Follower(self._js, self._link, plan.filters, plan.start)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if not tally.done:
            await follower.open(patient=False)
        try:
            while not tally.done and (msg := await follower.next(deadline)) is not None:
                # Domain filters bring other tasks' results too: skip them undecoded.
                if not tally.wants(msg.subject):
                    continue
                rollout = _decode_scored(msg)
                if rollout is not None and tally.add(rollout) and on_result is not None:
                    on_result(rollout, tally.progress)
        finally:
            await follower.close()
        if not tally.done:
            raise TimeoutError(tally.shortfall(timeout_s))
        return tally.results()

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


def _decode_scored(msg: Msg) -> ScoredRollout | None:
    try:
        return _SCORED.decode(msg.data)
    except DecodeError as error:
        _log.warning("skipping an undecodable scored rollout on %s: %s", msg.subject, error)
        return None
