"""Scoring throughput of the validator service vs the raw JetStream consume rate, in one run.

Every side takes the same Rollout messages (arithmetic domain, 80 tokens each,
answers right and wrong) from TEMPER_ROLLOUTS on a real nats-server (loopback).
The raw side only fetches (nats-py's ``fetch``) and acks.  The validator side fetches,
decodes, judges with the domain's math validator, publishes a ScoredRollout to
TEMPER_SCORED (waiting for the stream's ack, with a Nats-Msg-Id) and then acks.
Goal: the validator scores >= 60% of the raw consume rate.

For context, three more consumers of the same messages: fetch+ack with the runtime's
own puller (what the batch mode fetches with: the cheapest consume path here), and the
service runtime with a handler that does nothing, per message and in batch mode.

The sides run interleaved, round after round, after one untimed warm-up round, so
drift on a shared machine hits every side.  Besides the best rates, each round's
validator/raw ratio is printed: on a noisy machine it is the steadier figure.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import nats
from nats.js import JetStreamContext

from protocol import streams, subjects
from protocol.codec import Codec, encode
from protocol.messages import Rollout, rollout_id
from protocol.packed import pack_f32, pack_i32
from services.cli.common import run
from services.domains import load_registry
from services.runtime import (
    ConsumerSpec,
    ConsumerTuning,
    Delivery,
    Outcome,
    RuntimeSettings,
    Service,
)
from services.runtime.jetstream import ensure_consumer, ensure_stream, ensure_streams
from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from services.runtime.pull import Puller
from services.validator import ValidatorService, ValidatorSettings

N_ROLLOUTS = 10_000
N_WARM_UP = 2_000
BATCH = 256
#: The validator judges batches of a quarter of this (256) while earlier ones wait for acks.
VALIDATOR_IN_FLIGHT = 4 * BATCH
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


async def puller_rate(url: str, messages: list[tuple[str, bytes]]) -> float:
    """Fetch+ack with the runtime's puller instead of nats-py's fetch (context only)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await fill(js, messages)
    await ensure_consumer(js, ConsumerSpec(stream=STREAM, durable="bench-puller", ack_wait_s=60))
    puller = Puller(nc, STREAM, "bench-puller")
    await puller.start()
    started = time.perf_counter()
    got = 0
    while got < len(messages):
        for msg in await puller.fetch(BATCH, 2):
            await msg.ack()
            got += 1
    elapsed = time.perf_counter() - started
    await puller.close()
    await js.delete_consumer(STREAM, "bench-puller")
    await nc.close()
    return len(messages) / elapsed


class Idle(Service):
    """The runtime's consumer with a handler that only counts: per message, or in batches."""

    name = "bench-idle"
    streams = (streams.ROLLOUTS,)

    def __init__(self, runtime: RuntimeSettings, *, batches: bool) -> None:
        super().__init__(runtime)
        self.batches = batches
        self.handled = 0

    async def setup(self) -> None:
        spec = ConsumerSpec(stream=STREAM, durable="bench-idle", ack_wait_s=60)
        if self.batches:
            tuning = ConsumerTuning(max_in_flight=4 * BATCH, fetch_wait_s=0.2, batch_size=BATCH)
            self.consume_batch(spec, Codec(Rollout), self.handle_batch, tuning)
        else:
            tuning = ConsumerTuning(max_in_flight=BATCH, fetch_wait_s=0.2)
            self.consume(spec, Codec(Rollout), self.handle, tuning)

    async def handle(self, rollout: Rollout, delivery: Delivery) -> None:
        self.handled += 1

    async def handle_batch(self, items: list[tuple[Rollout, Delivery]]) -> Sequence[Outcome]:
        self.handled += len(items)
        return [None] * len(items)


async def idle_rate(url: str, messages: list[tuple[str, bytes]], *, batches: bool) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await fill(js, messages)
    service = Idle(RuntimeSettings(nats_url=url, heartbeat_s=60, stats_s=60), batches=batches)
    started = time.perf_counter()
    async with service:
        while service.handled < len(messages):  # noqa: ASYNC110 (same polling as below)
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
    await js.delete_consumer(STREAM, "bench-idle")
    await nc.close()
    return len(messages) / elapsed


async def idle_per_message(url: str, messages: list[tuple[str, bytes]]) -> float:
    return await idle_rate(url, messages, batches=False)


async def idle_batches(url: str, messages: list[tuple[str, bytes]]) -> float:
    return await idle_rate(url, messages, batches=True)


async def validator_rate(url: str, messages: list[tuple[str, bytes]]) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await fill(js, messages)
    settings = ValidatorSettings(
        runtime=RuntimeSettings(nats_url=url, heartbeat_s=60, stats_s=60),
        domain_plugins=False,
        durable="bench-validator",
        max_in_flight=VALIDATOR_IN_FLIGHT,
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
    # The next round's ids must not be duplicates: a purge keeps the stream's duplicate
    # window, so the stream is made anew.
    await js.delete_stream(streams.SCORED.name)
    await ensure_stream(js, streams.SCORED)
    await nc.close()
    return len(messages) / elapsed


Side = Callable[[str, list[tuple[str, bytes]]], Awaitable[float]]
#: label, unit, how it is measured; the first is the reference, the last the one judged.
SIDES: tuple[tuple[str, str, Side], ...] = (
    ("raw JetStream fetch+ack (nats-py)", "msg/s", raw_rate),
    ("  same, runtime's puller", "msg/s", puller_rate),
    ("runtime, no-op handler", "msg/s", idle_per_message),
    ("runtime batch mode, no-op handler", "msg/s", idle_batches),
    ("validator score+publish+ack", "rollouts/s", validator_rate),
)


async def measure(url: str) -> list[list[float]]:
    """rates[side][round]."""
    nc = await nats.connect(url)
    await ensure_streams(nc.jetstream(), (streams.ROLLOUTS, streams.SCORED))
    await nc.close()
    messages = payloads(N_ROLLOUTS)
    for _, _, side in SIDES:  # warm-up: first connections, caches, the server's files
        await side(url, messages[:N_WARM_UP])
    rates: list[list[float]] = [[] for _ in SIDES]
    for _ in range(REPEATS):  # interleaved, so drift on a noisy machine hits every side
        for index, (_, _, side) in enumerate(SIDES):
            rates[index].append(await side(url, messages))
    return rates


def report(rates: list[list[float]]) -> None:
    raw, scored = rates[0], rates[-1]
    print(f"validator throughput ({N_ROLLOUTS} rollouts, {DOMAIN}, best of {REPEATS})")
    for (label, unit, _), side in zip(SIDES, rates, strict=True):
        best, median = max(side), statistics.median(side)
        print(f"  {label:<36}{best:>9,.0f} {unit:<10} (median {median:,.0f})")
    for (label, _, _), side in zip(SIDES[1:], rates[1:], strict=True):
        print(f"  ratio {label.strip():<36}{max(side) / max(raw):>6.2f} of raw (best/best)")
    paired = [v / r for v, r in zip(scored, raw, strict=True)]
    rounds = "  ".join(f"{ratio:.2f}" for ratio in paired)
    median = statistics.median(paired)
    print(f"  validator/raw round by round          {rounds}  (median {median:.2f})")
    ratio = max(scored) / max(raw)
    verdict = "PASS" if ratio >= 0.6 else "MISS"
    print(f"  goal: >= 0.60 of raw (best/best)      {ratio:.2f} {verdict}")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(NatsServerSettings(store_dir=Path(tmp), port=RANDOM_PORT))
        server.start()
        try:
            # Services run on uvloop (see services.cli.common.run); every side gets the same loop.
            rates = run(lambda: measure(server.url))
        finally:
            server.stop()
    report(rates)
    return 0


if __name__ == "__main__":
    sys.exit(main())
