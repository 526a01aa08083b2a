"""The flood suite: the stack's usual task rate is measured first (a closed loop, as
``temper train`` feeds it), then tasks arrive at ten times that rate.  Every service's
memory stays bounded (RSS sampled), the overflow waits in the task stream and in the
scored stream (backpressure: the replay buffer holds at most its capacity), nothing is
dropped or dead-lettered, and every task is eventually served and trained on once.

The flood lasts ``TEMPER_FLOOD_S`` seconds (4 by default, to keep ``make test`` short;
60 for the full minute): at ten times the rate the stack serves, the backlog takes nine
times as long to drain as it took to build.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.messages import Stats, Task
from services.learner.ledger_check import check
from tests.integration.chaos import (
    GROUP,
    SERVICES,
    Stack,
    connected,
    make_tasks,
    running_stack,
    scored,
    stack_env,
    submit,
)

FLOOD_S = float(os.environ.get("TEMPER_FLOOD_S", "4"))
pytestmark = pytest.mark.timeout(int(900 + FLOOD_S * 30))
WARM_S = 10.0
#: Tasks outstanding while the usual rate is measured (``temper train``'s default).
IN_FLIGHT = 64
CAPACITY = 256
#: Allowed growth of a service's resident memory under the flood over its warm-up peak.
RSS_FACTOR = 1.5
RSS_SLACK_MB = 64.0
#: The drain may not stand still longer than this (the overall bound is the test timeout).
STALL_S = 90.0


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


@dataclass(kw_only=True)
class Sampler:
    """Peak RSS per service and peak backlogs, sampled while the flood runs."""

    peak_mb: dict[str, float] = field(default_factory=dict)
    task_backlog: int = 0
    scored_backlog: int = 0
    replay_held: float = 0.0

    def memory(self, stack: Stack) -> None:
        for name in SERVICES:
            pid = stack.pid(name)
            if pid is not None:
                self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), rss_mb(pid))


async def _backlogs(stack: Stack, sampler: Sampler) -> None:
    async with connected(stack.url) as nc:
        js = nc.jetstream()
        for spec in streams.TASK_STREAMS:
            for consumer in await js.consumers_info(spec.name):
                sampler.task_backlog = max(sampler.task_backlog, consumer.num_pending or 0)
        for consumer in await js.consumers_info(streams.SCORED.name):
            sampler.scored_backlog = max(sampler.scored_backlog, consumer.num_pending or 0)


async def _sample(stack: Stack, sampler: Sampler, stop: asyncio.Event) -> None:
    codec: Codec[Stats] = Codec(Stats)
    async with connected(stack.url) as nc:
        sub = await nc.subscribe(subjects.stats("replay"))
        while not stop.is_set():
            sampler.memory(stack)
            await _backlogs(stack, sampler)
            while True:
                try:
                    stats = codec.decode((await sub.next_msg(timeout=0.01)).data)
                except TimeoutError:
                    break
                held = stats.values.get("held", 0.0) + stats.values.get("leased", 0.0)
                sampler.replay_held = max(sampler.replay_held, held)
            await asyncio.sleep(0.5)
        await sub.unsubscribe()


class ScoredCount:
    """Scored rollouts seen on the bus (a core subscription: no re-reading the stream)."""

    def __init__(self) -> None:
        self.count = 0

    async def on_scored(self, _: object) -> None:
        self.count += 1


async def _usual_rate(stack: Stack, sampler: Sampler) -> tuple[float, int]:
    """Tasks scored per second with ``IN_FLIGHT`` tasks outstanding (as ``temper train``
    feeds the stack), once the stack serves; and the tasks submitted meanwhile."""
    tasks = iter(make_tasks(5000, seed=11, max_tokens=4))
    seen = ScoredCount()
    async with connected(stack.url) as nc:
        await nc.subscribe(subjects.scored_all(), cb=seen.on_scored)
        submitted = await _closed_loop(nc, tasks, seen, until=lambda: seen.count >= GROUP)
        start_count, started = seen.count, time.monotonic()
        submitted += await _closed_loop(
            nc,
            tasks,
            seen,
            until=lambda: time.monotonic() - started >= WARM_S,
            sampler=(stack, sampler),
        )
        rate = (seen.count - start_count) / GROUP / (time.monotonic() - started)
    return max(rate, 1.0), submitted


async def _closed_loop(
    nc: NATS,
    tasks: Iterator[Task],
    seen: ScoredCount,
    until: Callable[[], bool],
    sampler: tuple[Stack, Sampler] | None = None,
) -> int:
    submitted = 0
    async with asyncio.timeout(120):
        while not until():
            missing = seen.count // GROUP + IN_FLIGHT - submitted
            batch = [next(tasks) for _ in range(max(0, missing))]
            await submit(nc, batch)
            submitted += len(batch)
            if sampler is not None:
                sampler[1].memory(sampler[0])
            await asyncio.sleep(0.2)
    return submitted


async def _flood(stack: Stack, rate: float) -> int:
    tasks = make_tasks(int(rate * 10 * FLOOD_S) + 1, seed=12, max_tokens=4)
    tick = 0.2
    per_tick = max(1, round(rate * 10 * tick))
    async with connected(stack.url) as nc:
        for start in range(0, len(tasks), per_tick):
            began = time.monotonic()
            await submit(nc, tasks[start : start + per_tick])
            await asyncio.sleep(max(0.0, tick - (time.monotonic() - began)))
    return len(tasks)


async def _until_all_served(stack: Stack, rollouts: int, run_dir: Path) -> None:
    """Waits while the stack makes progress: the scored stream's size is polled cheaply (a
    full read of tens of thousands of rollouts every few seconds would take the two cores
    from the stack it measures), then the ledger until it has trained every trainable one."""
    async with connected(stack.url) as nc:
        js = nc.jetstream()

        async def stored() -> int:
            return int((await js.stream_info(streams.SCORED.name)).state.messages)

        await _while_progressing(stored, rollouts, "scored rollouts")
    found = await scored(stack.url)
    assert len(found.ids) >= rollouts, f"{len(found.ids)} distinct scored of {rollouts}"
    ledger = run_dir / "learner" / "ledger.jsonl"

    async def trained() -> int:
        return len(check(ledger).trained_ids & found.trainable)

    await _while_progressing(trained, len(found.trainable), "trained rollouts")


async def _while_progressing(count: Callable[[], Awaitable[int]], goal: int, what: str) -> None:
    """Returns once ``count`` reaches ``goal``; fails when it stops growing for ``STALL_S``."""
    best, last_growth = -1, time.monotonic()
    while (now := await count()) < goal:
        if now > best:
            best, last_growth = now, time.monotonic()
        assert time.monotonic() - last_growth < STALL_S, f"{what} stalled at {best} of {goal}"
        await asyncio.sleep(3.0)


async def _dead_letters(stack: Stack) -> int:
    async with connected(stack.url) as nc:
        info = await nc.jetstream().stream_info(streams.DEAD_LETTERS.name)
        return int(info.state.messages)


async def test_ten_times_the_usual_rate_is_queued_bounded_and_all_served(
    tmp_path: Path, tiny_model: Path
) -> None:
    env = stack_env(tiny_model, tmp_path, TEMPER_REPLAY_CAPACITY=str(CAPACITY))
    async with running_stack(tmp_path, env) as stack:
        for name in SERVICES:
            await stack.running_pid(name)
        warm = Sampler()
        rate, warmup = await _usual_rate(stack, warm)
        flooded = Sampler()
        stop = asyncio.Event()
        sampling = asyncio.ensure_future(_sample(stack, flooded, stop))
        submitted = await _flood(stack, rate)
        await _until_all_served(stack, (warmup + submitted) * GROUP, tmp_path)
        stop.set()
        await sampling
        dead = await _dead_letters(stack)
        await stack.shutdown()
    report = check(tmp_path / "learner" / "ledger.jsonl")
    assert report.ok, report.summary()
    assert dead == 0
    print(
        f"usual rate {rate:.1f} tasks/s; flood {submitted} tasks in {FLOOD_S:.0f} s; peak "
        f"task backlog {flooded.task_backlog}, scored backlog {flooded.scored_backlog}, "
        f"replay held {flooded.replay_held:.0f}; RSS MB warm {warm.peak_mb} flood "
        f"{flooded.peak_mb}"
    )
    assert flooded.task_backlog > rate, "the overflow waits in the task stream"
    assert flooded.replay_held <= CAPACITY, "the buffer never holds more than its capacity"
    for name, peak in flooded.peak_mb.items():
        bound = warm.peak_mb[name] * RSS_FACTOR + RSS_SLACK_MB
        assert peak <= bound, f"{name}: {peak:.0f} MB under the flood, bound {bound:.0f} MB"
