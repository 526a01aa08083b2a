"""Scoring throughput of the validator service vs the raw JetStream consume rate, in one run.

Both sides take the same Rollout messages (arithmetic domain, 80 tokens each,
answers right and wrong) from TEMPER_ROLLOUTS on a real nats-server (loopback).
The raw side only fetches and acks.  The validator side fetches, decodes, judges
with the domain's math validator, publishes a ScoredRollout to TEMPER_SCORED
(waiting for the stream's ack, with a Nats-Msg-Id) and then acks.  Goal: the
validator scores >= 60% of the raw consume rate.

A third figure, for context: the service runtime consuming the same messages with a
handler that does nothing (the floor under any per-message service).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nats
from nats.js import JetStreamContext

from protocol import streams, subjects
from protocol.codec import Codec, encode
from protocol.messages import Rollout, rollout_id
from protocol.packed import pack_f32, pack_i32
from services.cli.common import run
from services.domains import load_registry
from services.runtime import ConsumerSpec, ConsumerTuning, Delivery, RuntimeSettings, Service
from services.runtime.jetstream import ensure_consumer, ensure_streams
from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from services.validator import ValidatorService, ValidatorSettings

N_ROLLOUTS = 10_000
BATCH = 256
REPEATS = 3
DOMAIN = "arithmetic"
PROMPT, COMPLETION = 64, 16
STREAM = streams.ROLLOUTS.name


def payloads(count: int) -> list[tuple[str, bytes]]:
    """(subject, encoded Rollout) for ``count`` rollouts; every third answer is wrong."""
    examples = load_registry(None, plugins=False).get(DOMAIN).examples(count, seed=7)
    out = []
    for index, example in enumerate(examples):
        text = example.reference if index % 3 else "<answer>-1</answer>"
        rollout = Rollout(
            id=rollout_id(example.task.id, 0),
            task=example.task,
            sample_index=0,
            tokens=pack_i32(range(PROMPT + COMPLETION)),
            prompt_len=PROMPT,
            logprobs=pack_f32([-0.5] * COMPLETION),
            loss_mask=bytes([1]) * COMPLETION,
            completion_text=text,
        )
        out.append((subjects.rollout(DOMAIN), encode(rollout)))
    return out


async def fill(js: JetStreamContext, messages: list[tuple[str, bytes]]) -> None:
    for start in range(0, len(messages), 1000):
        chunk = messages[start : start + 1000]
        acks = [await js.publish_async(subject, data) for subject, data in chunk]
        await asyncio.gather(*acks)


async def raw_rate(url: str, messages: list[tuple[str, bytes]]) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await fill(js, messages)
    await ensure_consumer(js, ConsumerSpec(stream=STREAM, durable="bench-raw", ack_wait_s=60))
    sub = await js.pull_subscribe_bind("bench-raw", STREAM)
    started = time.perf_counter()
    got = 0
    while got < len(messages):
        for msg in await sub.fetch(BATCH, timeout=2):
            await msg.ack()
            got += 1
    elapsed = time.perf_counter() - started
    await js.delete_consumer(STREAM, "bench-raw")
    await nc.close()
    return len(messages) / elapsed


class Idle(Service):
    """The runtime's consumer with a handler that only counts."""

    name = "bench-idle"
    streams = (streams.ROLLOUTS,)

    def __init__(self, runtime: RuntimeSettings) -> None:
        super().__init__(runtime)
        self.handled = 0

    async def setup(self) -> None:
        spec = ConsumerSpec(stream=STREAM, durable="bench-idle", ack_wait_s=60)
        tuning = ConsumerTuning(max_in_flight=BATCH, fetch_wait_s=0.2)
        self.consume(spec, Codec(Rollout), self.handle, tuning)

    async def handle(self, rollout: Rollout, delivery: Delivery) -> None:
        self.handled += 1


async def idle_rate(url: str, messages: list[tuple[str, bytes]]) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await fill(js, messages)
    service = Idle(RuntimeSettings(nats_url=url, heartbeat_s=60, stats_s=60))
    started = time.perf_counter()
    async with service:
        while service.handled < len(messages):  # noqa: ASYNC110 (same polling as below)
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
    await js.delete_consumer(STREAM, "bench-idle")
    await nc.close()
    return len(messages) / elapsed


async def validator_rate(url: str, messages: list[tuple[str, bytes]]) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await fill(js, messages)
    settings = ValidatorSettings(
        runtime=RuntimeSettings(nats_url=url, heartbeat_s=60, stats_s=60),
        domain_plugins=False,
        durable="bench-validator",
        max_in_flight=BATCH,
        fetch_wait_s=0.2,
    )
    service = ValidatorService(settings)
    started = time.perf_counter()
    async with service:
        # Polls a counter the service owns; a 5 ms grain is far below the run's length.
        while service.published + service.duplicates < len(messages):  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
    await js.delete_consumer(STREAM, "bench-validator")
    await js.purge_stream(streams.SCORED.name)  # the next round's ids must not be duplicates
    await nc.close()
    return len(messages) / elapsed


async def measure(url: str) -> tuple[list[float], list[float], list[float]]:
    nc = await nats.connect(url)
    await ensure_streams(nc.jetstream(), (streams.ROLLOUTS, streams.SCORED))
    await nc.close()
    messages = payloads(N_ROLLOUTS)
    raw, idle, scored = [], [], []
    for _ in range(REPEATS):  # interleaved, so drift on a noisy machine hits every side
        raw.append(await raw_rate(url, messages))
        idle.append(await idle_rate(url, messages))
        scored.append(await validator_rate(url, messages))
    return raw, idle, scored


def figure(label: str, rates: list[float], unit: str) -> None:
    print(f"  {label:<32}{max(rates):>9,.0f} {unit:<10} (median {statistics.median(rates):,.0f})")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(NatsServerSettings(store_dir=Path(tmp), port=RANDOM_PORT))
        server.start()
        try:
            # Services run on uvloop (see services.cli.common.run); both sides get the same loop.
            raw, idle, scored = run(lambda: measure(server.url))
        finally:
            server.stop()
    ratio = max(scored) / max(raw)
    print(f"validator throughput ({N_ROLLOUTS} rollouts, {DOMAIN}, best of {REPEATS})")
    figure("raw JetStream fetch+ack", raw, "msg/s")
    figure("runtime, no-op handler", idle, "msg/s")
    figure("validator score+publish+ack", scored, "rollouts/s")
    print(f"  ratio runtime no-op/raw           {max(idle) / max(raw):>9.2f}")
    print(f"  ratio validator/raw               {ratio:>9.2f}")
    print(f"  goal: >= 0.60 of raw              {'PASS' if ratio >= 0.6 else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
