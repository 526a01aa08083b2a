"""Consume throughput through the service runtime vs raw nats-py, in one run.

Both sides pull the same number of Task messages from a JetStream work queue on
a real nats-server (loopback) and ack each one.  The raw side only fetches and
acks; the runtime side fetches, decodes into a typed Task, runs a handler with
its in-progress keep-alive and metrics, and acks.  Goal: runtime >= 60% of raw.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nats

from protocol import Codec, Task, pack_i32, streams, subjects
from services.cli.common import run
from services.runtime import ConsumerSpec, ConsumerTuning, Delivery, RuntimeSettings, Service
from services.runtime.jetstream import ensure_consumer, ensure_streams
from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings

N_MESSAGES = 20_000
BATCH = 256
REPEATS = 3
TIER = 1
STREAM = streams.task_stream_name(TIER)


class CountingService(Service):
    name = "bench"

    def __init__(self, runtime: RuntimeSettings, target: int) -> None:
        super().__init__(runtime)
        self.handled = 0
        self.target = target
        self.done = asyncio.Event()

    async def setup(self) -> None:
        spec = ConsumerSpec(stream=STREAM, durable="bench-runtime", ack_wait_s=30)
        tuning = ConsumerTuning(max_in_flight=BATCH, fetch_wait_s=0.2)
        self.consume(spec, Codec(Task), self.handle, tuning)

    async def handle(self, task: Task, delivery: Delivery) -> None:
        self.handled += 1
        if self.handled >= self.target:
            self.done.set()


async def fill(js: nats.js.JetStreamContext, count: int) -> None:
    codec = Codec(Task)
    payload = codec.encode(Task(id="bench", domain="arithmetic", prompt_tokens=pack_i32(range(64))))
    subject = subjects.task(TIER, "arithmetic")
    for start in range(0, count, 1000):
        acks = [js.publish_async(subject, payload) for _ in range(min(1000, count - start))]
        await asyncio.gather(*[await a for a in acks])


async def raw_rate(url: str) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await fill(js, N_MESSAGES)
    await ensure_consumer(js, ConsumerSpec(stream=STREAM, durable="bench-raw", ack_wait_s=30))
    sub = await js.pull_subscribe_bind("bench-raw", STREAM)
    started = time.perf_counter()
    got = 0
    while got < N_MESSAGES:
        for msg in await sub.fetch(BATCH, timeout=2):
            await msg.ack()
            got += 1
    elapsed = time.perf_counter() - started
    await js.delete_consumer(STREAM, "bench-raw")
    await nc.close()
    return N_MESSAGES / elapsed


async def runtime_rate(url: str) -> float:
    nc = await nats.connect(url)
    await fill(nc.jetstream(), N_MESSAGES)
    service = CountingService(RuntimeSettings(nats_url=url, heartbeat_s=60, stats_s=60), N_MESSAGES)
    started = time.perf_counter()
    async with service:
        await service.done.wait()
        elapsed = time.perf_counter() - started
    await nc.jetstream().delete_consumer(STREAM, "bench-runtime")
    await nc.close()
    return N_MESSAGES / elapsed


async def measure(url: str) -> tuple[list[float], list[float]]:
    nc = await nats.connect(url)
    await ensure_streams(nc.jetstream(), streams.ALL)
    await nc.close()
    raw, runtime = [], []
    for _ in range(REPEATS):  # interleaved, so drift on a noisy machine hits both sides
        raw.append(await raw_rate(url))
        runtime.append(await runtime_rate(url))
    return raw, runtime


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(NatsServerSettings(store_dir=Path(tmp), port=RANDOM_PORT))
        server.start()
        try:
            # Services run on uvloop (see services.cli.common.run); both sides get the same loop.
            raw, runtime = run(lambda: measure(server.url))
        finally:
            server.stop()
    raw_best, runtime_best = max(raw), max(runtime)
    ratio = runtime_best / raw_best
    print(
        f"runtime consume throughput ({N_MESSAGES} tasks, fetch batch {BATCH}, best of {REPEATS})"
    )
    print(
        f"  raw nats-py fetch+ack        {raw_best:>10,.0f} msg/s"
        f"   (median {statistics.median(raw):,.0f})"
    )
    print(
        f"  runtime fetch+decode+ack     {runtime_best:>10,.0f} msg/s"
        f"   (median {statistics.median(runtime):,.0f})"
    )
    print(f"  ratio runtime/raw            {ratio:>10.2f}")
    print(f"  goal: >= 0.60 of raw         {'PASS' if ratio >= 0.6 else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
