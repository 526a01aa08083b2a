"""Helpers for the runtime's integration tests: a test service, fast timings, stream readers.

Every wait here is bounded (``asyncio.timeout``) so a runtime bug fails a test
instead of hanging it.  Timings are parameters: the defaults keep each test
around a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from protocol import streams, subjects
from protocol.codec import ANY, Codec
from protocol.messages import ChatMessage, Message, Task
from protocol.servers import server_list
from services.runtime import ConsumerSpec, ConsumerTuning, Delivery, RuntimeSettings, Service

TIER: int = 1
DOMAIN: str = "math"
TASK_STREAM: str = streams.task_stream_name(TIER)
TASK_SUBJECT: str = subjects.task(TIER, DOMAIN)
DURABLE: str = "rt-test"
SERVICE_NAME: str = "rt-test"
#: Only the streams the test service touches: its task stream, error events and dead letters.
TEST_STREAMS: tuple[streams.StreamSpec, ...] = (
    streams.BY_NAME[TASK_STREAM],
    streams.ERRORS,
    streams.DEAD_LETTERS,
)
FAST_TUNING = ConsumerTuning(
    max_in_flight=16, fetch_wait_s=0.1, nak_delay_s=0.05, error_backoff_s=0.05
)
TASKS = Codec(Task)

TaskHandler = Callable[[Task, Delivery], Awaitable[None]]


def runtime(url: str, instance: str = "a", **overrides: Any) -> RuntimeSettings:
    """Runtime settings with short timings for tests."""
    values: dict[str, Any] = {
        "nats_url": url,
        "instance": instance,
        "grace_s": 5.0,
        "heartbeat_s": 0.1,
        "stats_s": 0.1,
        "connect_timeout_s": 2.0,
        "reconnect_wait_s": 0.1,
    }
    values.update(overrides)
    return RuntimeSettings(**values)


def consumer_spec(
    *, ack_wait_s: float = 5.0, max_deliver: int = 5, durable: str = DURABLE
) -> ConsumerSpec:
    return ConsumerSpec(
        stream=TASK_STREAM,
        durable=durable,
        filter_subject=subjects.task_tier(TIER),
        ack_wait_s=ack_wait_s,
        max_deliver=max_deliver,
    )


async def no_work(task: Task, delivery: Delivery) -> None:
    return None


@dataclass(frozen=True)
class Seen:
    """One call of the handler."""

    id: str
    num_delivered: int
    instance: str


class TaskService(Service):
    """Consumes Tasks from the tier-1 stream with a pluggable handler, and records what it saw."""

    name = SERVICE_NAME
    streams = TEST_STREAMS

    def __init__(
        self,
        runtime: RuntimeSettings,
        handler: TaskHandler = no_work,
        *,
        spec: ConsumerSpec | None = None,
        tuning: ConsumerTuning = FAST_TUNING,
    ) -> None:
        super().__init__(runtime)
        self.handler = handler
        self.spec = spec or consumer_spec()
        self.tuning = tuning
        self.setups = 0
        #: Every delivery that reached the handler, in order.
        self.seen: list[Seen] = []
        #: Ids whose handler returned (the runtime acks them next).
        self.handled: list[str] = []
        self.changed = asyncio.Event()

    async def setup(self) -> None:
        self.setups += 1
        self.consume(self.spec, TASKS, self._handle, self.tuning)

    async def _handle(self, task: Task, delivery: Delivery) -> None:
        self.seen.append(Seen(task.id, delivery.num_delivered, self.instance))
        self._poke()
        await self.handler(task, delivery)
        self.handled.append(task.id)
        self._poke()

    def _poke(self) -> None:
        self.changed.set()
        self.changed.clear()

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Wait until ``predicate()`` holds; checked each time the handler starts or ends."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await self.changed.wait()


def counter(service: Service, name: str, **labels: str) -> float:
    """Current value of one of the service's Prometheus counters (``temper_<name>_total``)."""
    value = service.metrics.registry.get_sample_value(f"temper_{name}_total", labels)
    return 0.0 if value is None else float(value)


def raise_if_crashed(*services: Service) -> None:
    """Fail at once, with the reason, when a service's work died: waiting on it would only
    run into the test's timeout and say nothing."""
    for service in services:
        if service.crashed.is_set():
            raise AssertionError(f"{service.name} crashed: {service.failure!r}") from (
                service.failure
            )


def describe(*services: Service) -> str:
    """Each service's state and health detail, for a failure message."""
    parts = []
    for service in services:
        healthy, detail = service.health()
        parts.append(f"{service.name}: {service.state.value} healthy={healthy} {detail}")
    return "; ".join(parts)


def make_task(i: int | str) -> Task:
    return Task(id=f"t{i}", domain=DOMAIN, prompt=[ChatMessage(role="user", content=f"task {i}")])


@contextlib.asynccontextmanager
async def client(url: str) -> AsyncIterator[NATS]:
    """A plain nats-py connection, as a test's own client (``url``: one server or several)."""
    nc = await nats.connect(
        server_list(url), connect_timeout=2, max_reconnect_attempts=-1, reconnect_time_wait=0.1
    )
    try:
        yield nc
    finally:
        await nc.close()


async def declare(js: JetStreamContext) -> None:
    from services.runtime.jetstream import ensure_streams

    await ensure_streams(js, TEST_STREAMS)


async def publish_tasks(js: JetStreamContext, ids: list[str] | range) -> list[str]:
    """Publish one task per id (each with its id as ``Nats-Msg-Id``); returns the task ids."""
    out = []
    for i in ids:
        task = make_task(i)
        await js.publish(TASK_SUBJECT, TASKS.encode(task), headers={"Nats-Msg-Id": task.id})
        out.append(task.id)
    return out


async def stream_count(js: JetStreamContext, stream: str) -> int:
    info = await js.stream_info(stream)
    return int(info.state.messages)


async def wait_count(
    js: JetStreamContext, stream: str, expected: int, timeout_s: float = 5.0
) -> None:
    """Wait until ``stream`` holds exactly ``expected`` messages.

    Acks are fire-and-forget, so the server may apply them a moment after the handler returned.
    """
    async with asyncio.timeout(timeout_s):
        while True:
            if await stream_count(js, stream) == expected:
                return
            await asyncio.sleep(0.02)


async def stream_entries(
    js: JetStreamContext, stream: str, subject: str | None = None
) -> list[api.RawStreamMsg]:
    """Every message stored in ``stream`` (optionally on one subject), oldest first."""
    info = await js.stream_info(stream)
    out = []
    if info.state.messages == 0:
        return out
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            entry = await js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            continue
        if subject is None or entry.subject == subject:
            out.append(entry)
    return out


async def wait_entries(
    js: JetStreamContext,
    stream: str,
    count: int,
    subject: str | None = None,
    timeout_s: float = 5.0,
) -> list[api.RawStreamMsg]:
    """Wait until ``stream`` holds at least ``count`` messages (on ``subject``) and return them."""
    async with asyncio.timeout(timeout_s):
        while True:
            entries = await stream_entries(js, stream, subject)
            if len(entries) >= count:
                return entries
            await asyncio.sleep(0.02)


class Inbox:
    """A core NATS subscription whose messages the test reads one by one."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    @classmethod
    async def open(cls, nc: NATS, subject: str) -> Inbox:
        sub = await nc.subscribe(subject)
        # Twice: nats-py's flush PING can overtake a SUB still queued for its flusher.
        await nc.flush()
        await nc.flush()
        return cls(sub)

    async def next(self, timeout_s: float = 5.0) -> Msg:
        msg: Msg = await self._sub.next_msg(timeout=timeout_s)
        return msg

    async def next_message(self, timeout_s: float = 5.0) -> Message:
        return ANY.decode((await self.next(timeout_s)).data)  # type: ignore[return-value]

    async def until(self, predicate: Callable[[Any], bool], timeout_s: float = 5.0) -> Any:
        """The first decoded message for which ``predicate`` holds."""
        async with asyncio.timeout(timeout_s):
            while True:
                message = await self.next_message(timeout_s)
                if predicate(message):
                    return message


async def serve(name: str, env: Mapping[str, str], log: Path) -> asyncio.subprocess.Process:
    """``temper serve NAME`` as a real process (to be killed), its output appended to ``log``."""
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "services", "serve", name),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd=Path(__file__).resolve().parents[2],
            env=dict(env),
        )


T = TypeVar("T")


class Tap(Generic[T]):
    """Every message of one type heard on a subscription, in arrival order."""

    def __init__(self, codec: Codec[T]) -> None:
        self.codec = codec
        self.got: list[T] = []
        self.changed = asyncio.Event()

    async def on_msg(self, msg: Msg) -> None:
        self.got.append(self.codec.decode(msg.data))
        self.changed.set()

    async def wait(self, count: int, timeout_s: float = 60.0) -> list[T]:
        async with asyncio.timeout(timeout_s):
            while len(self.got) < count:
                self.changed.clear()
                await self.changed.wait()
        return self.got
