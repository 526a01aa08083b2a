"""The runtime's batch mode on a real nats-server: outcomes per message, nothing lost.

Run as a module (``python -m tests.integration.test_runtime_batch URL SUBJECT``) it is the
process the crash test kills: a batch service that announces each batch and never returns.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import msgpack

from protocol import headers as h
from protocol import streams, subjects
from protocol.errors import ErrorCode
from protocol.messages import ServiceState, Task
from services.runtime import (
    ConsumerSpec,
    ConsumerTuning,
    Delivery,
    Reject,
    Result,
    RuntimeSettings,
    Service,
)
from services.runtime.natsserver import NatsServer
from services.runtime.priority import PriorityGate
from services.runtime.procs import child_preexec
from tests.integration.support import (
    SERVICE_NAME,
    TASK_STREAM,
    TASK_SUBJECT,
    TASKS,
    TEST_STREAMS,
    Inbox,
    Seen,
    client,
    consumer_spec,
    counter,
    declare,
    make_task,
    publish_tasks,
    runtime,
    stream_count,
    wait_count,
    wait_entries,
)
from tests.integration.test_runtime_reconnect import _publish_with_retry

REPO = Path(__file__).resolve().parents[2]
DLQ_SUBJECT = subjects.dead_letter(TASK_STREAM)
FAST = ConsumerTuning(
    max_in_flight=32, fetch_wait_s=0.1, nak_delay_s=0.05, error_backoff_s=0.05, batch_size=16
)

Items = list[tuple[Task, Delivery]]
BatchFn = Callable[[Items], Awaitable[Sequence[Result]]]


async def ack_all(items: Items) -> list[Result]:
    return [None] * len(items)


class BatchService(Service):
    """Consumes the tier-1 task stream in batch mode and records every call of its handler."""

    name = SERVICE_NAME
    streams = TEST_STREAMS

    def __init__(
        self,
        settings: RuntimeSettings,
        handler: BatchFn = ack_all,
        *,
        spec: ConsumerSpec | None = None,
        tuning: ConsumerTuning = FAST,
    ) -> None:
        super().__init__(settings)
        self.handler = handler
        self.spec = spec or consumer_spec()
        self.tuning = tuning
        self.seen: list[Seen] = []
        self.batches: list[list[str]] = []

    async def setup(self) -> None:
        self.consume_batch(self.spec, TASKS, self._handle, self.tuning)

    async def _handle(self, items: Items) -> Sequence[Result]:
        self.batches.append([task.id for task, _ in items])
        self.seen += [Seen(task.id, d.num_delivered, self.instance) for task, d in items]
        return await self.handler(items)

    def deliveries(self, task_id: str) -> list[int]:
        return [seen.num_delivered for seen in self.seen if seen.id == task_id]

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await asyncio.sleep(0.01)


async def test_a_fetch_reaches_the_handler_whole_and_is_acked_after_it_returns(
    nats_url: str,
) -> None:
    release = asyncio.Event()

    async def held(items: Items) -> list[Result]:
        await release.wait()
        return [None] * len(items)

    async with client(nats_url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        ids = await publish_tasks(js, range(12))
        async with BatchService(runtime(nats_url), held) as service:
            await service.wait_for(lambda: len(service.seen) == 12)
            assert len(service.batches) == 1  # all there: one fetch, one call
            await asyncio.sleep(0.2)
            assert await stream_count(js, TASK_STREAM) == 12  # nothing acked while it runs
            release.set()
            await wait_count(js, TASK_STREAM, 0)
            assert counter(service, "acked", source=TASK_STREAM) == 12
        assert sorted(seen.id for seen in service.seen) == sorted(ids)


async def test_a_failed_message_is_handed_back_alone_then_dead_lettered(nats_url: str) -> None:
    async def poison_fails(items: Items) -> list[Result]:
        return [ValueError("boom") if t.id == "tpoison" else None for t, _ in items]

    async with client(nats_url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        raw = TASKS.encode(make_task("poison"))
        await publish_tasks(js, ["a", "poison", "b"])
        spec = consumer_spec(max_deliver=3)
        async with BatchService(runtime(nats_url), poison_fails, spec=spec) as service:
            [entry] = await wait_entries(js, streams.DEAD_LETTERS.name, 1, subject=DLQ_SUBJECT)
            await wait_count(js, TASK_STREAM, 0)
        assert service.deliveries("tpoison") == [1, 2, 3]
        assert service.deliveries("ta") == service.deliveries("tb") == [1]
        assert entry.data == raw
        hdrs = entry.headers or {}
        assert hdrs[h.DLQ_CODE] == "max_deliver" and "boom" in hdrs[h.DLQ_REASON]
        assert counter(service, "failed", source=TASK_STREAM) == 3


async def test_rejects_and_undecodable_bytes_are_dead_lettered_and_the_rest_acked(
    nats_url: str,
) -> None:
    async def rejects(items: Items) -> list[Result]:
        hopeless = Reject(ErrorCode.VALIDATION, "no answer")
        return [hopeless if t.id == "thopeless" else None for t, _ in items]

    bad_map = msgpack.unpackb(TASKS.encode(make_task("bad")))
    bad_map["tier"] = 99
    garbage, invalid = b"\xc1 not msgpack", msgpack.packb(bad_map)
    async with client(nats_url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        await publish_tasks(js, ["good"])
        await js.publish(TASK_SUBJECT, garbage)
        await js.publish(TASK_SUBJECT, invalid)
        await publish_tasks(js, ["hopeless", "fine"])
        async with BatchService(runtime(nats_url), rejects) as service:
            dead = await wait_entries(js, streams.DEAD_LETTERS.name, 3, subject=DLQ_SUBJECT)
            await wait_count(js, TASK_STREAM, 0)
        codes = sorted((e.headers or {})[h.DLQ_CODE] for e in dead)
        assert codes == ["not_msgpack", "validation", "validation"]
        originals = {e.data: (e.headers or {}).get(h.DLQ_FIELD) for e in dead}
        assert originals[invalid] == "$.tier"
        assert garbage in originals and TASKS.encode(make_task("hopeless")) in originals
        # Bytes that do not decode never reach the handler; every good one is seen once.
        assert sorted(seen.id for seen in service.seen) == ["tfine", "tgood", "thopeless"]
        assert counter(service, "acked", source=TASK_STREAM) == 2


async def test_the_priority_gate_bounds_batches_and_gets_every_slot_back(nats_url: str) -> None:
    gate = PriorityGate(tiers=1, capacity=5)
    peak = 0

    async def watch(items: Items) -> list[Result]:
        nonlocal peak
        peak = max(peak, gate.statistics().in_flight)
        await asyncio.sleep(0.01)
        return [None] * len(items)

    tuning = ConsumerTuning(max_in_flight=32, fetch_wait_s=0.1, batch_size=16, gate=gate, tier=0)
    async with client(nats_url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        await publish_tasks(js, range(23))
        async with BatchService(runtime(nats_url), watch, tuning=tuning) as service:
            await wait_count(js, TASK_STREAM, 0)
            await service.wait_for(lambda: gate.statistics().in_flight == 0)
        assert max(len(batch) for batch in service.batches) <= 5 and peak <= 5
        assert len(service.seen) == 23


async def test_a_deferred_outcome_holds_back_only_its_own_message(nats_url: str) -> None:
    slow_done = asyncio.Event()

    async def slow(items: Items) -> list[Result]:
        async def later() -> Exception | None:
            await slow_done.wait()
            return None

        return [later() if t.id == "tslow" else None for t, _ in items]

    async with client(nats_url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        await publish_tasks(js, ["slow", "quick1", "quick2"])
        async with BatchService(runtime(nats_url), slow) as service:
            await wait_count(js, TASK_STREAM, 1)  # the quick ones are acked at once
            assert service.in_flight == 1
            slow_done.set()
            await wait_count(js, TASK_STREAM, 0)
        assert all(seen.num_delivered == 1 for seen in service.seen)


async def test_a_handler_that_raises_fails_its_whole_batch(nats_url: str) -> None:
    calls = 0

    async def flaky(items: Items) -> list[Result]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("bug on the first call")
        return [None] * len(items)

    async with client(nats_url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        await publish_tasks(js, ["x", "y"])
        async with BatchService(runtime(nats_url), flaky) as service:
            await wait_count(js, TASK_STREAM, 0)
        assert sorted((s.id, s.num_delivered) for s in service.seen) == [
            ("tx", 1),
            ("tx", 2),
            ("ty", 1),
            ("ty", 2),
        ]
        assert not service.crashed.is_set()


async def test_in_progress_acks_keep_a_long_batch_from_redelivery(nats_url: str) -> None:
    ack_wait = 0.5

    async def long(items: Items) -> list[Result]:
        await asyncio.sleep(3 * ack_wait)
        return [None] * len(items)

    async with client(nats_url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        await publish_tasks(js, [1, 2])
        spec = consumer_spec(ack_wait_s=ack_wait)
        async with BatchService(runtime(nats_url), long, spec=spec) as service:
            await wait_count(js, TASK_STREAM, 0, timeout_s=10)
            info = await js.consumer_info(TASK_STREAM, spec.durable)
            assert info.num_redelivered == 0
        assert [s.num_delivered for s in service.seen] == [1, 1]


async def test_stop_hands_back_what_is_unfinished(nats_url: str) -> None:
    async def forever(items: Items) -> list[Result]:
        await asyncio.Event().wait()
        return []

    spec = consumer_spec(ack_wait_s=30.0)  # a second delivery can only come from the nak
    async with client(nats_url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        await publish_tasks(js, [1, 2, 3])
        first = BatchService(runtime(nats_url, "first", grace_s=0.05), forever, spec=spec)
        async with first:
            await first.wait_for(lambda: len(first.seen) == 3)
        assert counter(first, "handed_back", source=TASK_STREAM) == 3
        async with BatchService(runtime(nats_url, "second"), spec=spec) as second:
            await wait_count(js, TASK_STREAM, 0)
        assert sorted(s.num_delivered for s in second.seen) == [2, 2, 2]


async def test_a_process_killed_mid_batch_loses_nothing(nats_url: str) -> None:
    ack_wait = 1.0
    announce = "test.batch.received"
    async with client(nats_url) as nc, asyncio.timeout(40):
        js = nc.jetstream()
        await declare(js)
        ids = await publish_tasks(js, range(6))
        inbox = await Inbox.open(nc, announce)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.integration.test_runtime_batch",
            nats_url,
            announce,
            str(ack_wait),
            cwd=REPO,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            preexec_fn=child_preexec(),
        )
        try:
            received = (await inbox.next(timeout_s=20)).data.decode().split()
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        assert sorted(received) == sorted(ids)  # the whole batch was in hand, unacked

        spec = consumer_spec(ack_wait_s=ack_wait)
        async with BatchService(runtime(nats_url, "survivor"), spec=spec) as survivor:
            await wait_count(js, TASK_STREAM, 0, timeout_s=10)
        assert sorted(s.id for s in survivor.seen) == sorted(ids)
        assert all(s.num_delivered >= 2 for s in survivor.seen)


async def test_a_server_crash_mid_stream_loses_nothing(nats_server: NatsServer) -> None:
    total, kill_after = 200, 40
    url = nats_server.url

    async def step(items: Items) -> list[Result]:
        await asyncio.sleep(0.01)
        return [None] * len(items)

    spec = consumer_spec(ack_wait_s=1.0, max_deliver=100)
    tuning = ConsumerTuning(
        max_in_flight=8, fetch_wait_s=0.1, nak_delay_s=0.05, error_backoff_s=0.05, batch_size=4
    )
    ids = {make_task(i).id for i in range(total)}
    async with client(url) as nc, asyncio.timeout(60):
        js = nc.jetstream()
        await declare(js)
        async with BatchService(runtime(url), step, spec=spec, tuning=tuning) as service:
            publisher = asyncio.create_task(_publish_with_retry(js, range(total)))
            try:
                await service.wait_for(lambda: len(service.seen) >= kill_after, timeout_s=20)
                await asyncio.to_thread(nats_server.kill)
                await asyncio.sleep(0.3)
                await asyncio.to_thread(nats_server.start)
                await publisher
            finally:
                publisher.cancel()
            await service.wait_for(lambda: {s.id for s in service.seen} == ids, timeout_s=30)
            await wait_count(js, TASK_STREAM, 0, timeout_s=15)
            assert service.state is ServiceState.RUNNING and not service.crashed.is_set()


async def _announce_then_hang(url: str, subject: str, ack_wait_s: float) -> None:
    service: BatchService

    async def hang(items: Items) -> list[Result]:
        received = " ".join(task.id for task, _ in items)
        await service.bus.nc.publish(subject, received.encode())
        await service.bus.nc.flush()
        await asyncio.Event().wait()
        return []

    spec = consumer_spec(ack_wait_s=ack_wait_s)
    service = BatchService(runtime(url, "doomed"), hang, spec=spec)
    async with service:
        await service.crashed.wait()


if __name__ == "__main__":
    asyncio.run(_announce_then_hang(sys.argv[1], sys.argv[2], float(sys.argv[3])))
