"""What the chaos suites share: a ``temper train``-style stack under the supervisor, a
fixed set of tasks, and readers for what the bus and the ledger hold at the end."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import nats.js.api
from nats.aio.client import Client as NATS

from protocol import streams, subjects
from protocol.codec import Codec, encode
from protocol.messages import PolicyUpdate, ScoredRollout, Stats, Task
from services.supervisor import StackSettings, Supervisor
from tests.integration.support import client
from tests.integration.test_cli_harness import free_port
from tests.integration.test_supervisor import alive

SERVICES = ("control", "generator", "validator", "replay", "learner")
DOMAIN = "arithmetic_sum3"
GROUP = 4


def stack_env(model: Path, run_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        "TEMPER_GENERATOR_MODEL": str(model),
        "TEMPER_GENERATOR_TOOLS": "local",
        "TEMPER_GENERATOR_MAX_CONCURRENT_TASKS": "8",
        "TEMPER_GENERATOR_THREADS": "1",
        "TEMPER_LEARNER_MODEL": str(model),
        "TEMPER_LEARNER_OUT_DIR": str(run_dir / "learner"),
        "TEMPER_LEARNER_BATCH_SIZE": "32",
        # The suites wait for every trainable rollout to be trained: the last few must
        # not stay held in the buffer below a minimum batch.
        "TEMPER_LEARNER_MIN_SAMPLES": "1",
        "TEMPER_LEARNER_SAMPLE_WAIT_S": "0.5",
        "TEMPER_LEARNER_CHECKPOINT_EVERY": "2",
        "TEMPER_LEARNER_THREADS": "1",
        "TEMPER_LEARNER_TENSORBOARD": "false",
        # A random policy rarely earns a reward: without this no update would be applied
        # and no version published, and the weight path would go untested.
        "TEMPER_LEARNER_SKIP_ZERO_ADVANTAGE": "false",
        # Versions jump after restarts: nothing may be dropped as stale in these suites,
        # so that every rollout's fate is "trained exactly once".
        "TEMPER_REPLAY_MAX_STALENESS": "1000000",
        "TEMPER_LEARNER_MAX_STALENESS": "1000000",
        "TEMPER_REPLAY_ACK_WAIT_S": "10",
        "TEMPER_STATS_S": "1",
        "TEMPER_HEARTBEAT_S": "1",
    }
    env.update(extra)
    return env


class Stack:
    """The supervisor and its watch loop; ``shutdown`` stops both in order (idempotent)."""

    def __init__(self, settings: StackSettings) -> None:
        self.supervisor = Supervisor(settings, say=self._said)
        self.lines: list[str] = []
        #: Every process pid seen, for the check that none is left.
        self.pids: set[int] = set()
        self._stop = asyncio.Event()
        self._watch: asyncio.Future[None] | None = None

    def _said(self, line: str) -> None:
        self.lines.append(f"{time.strftime('%H:%M:%S')} {line}")

    @property
    def url(self) -> str:
        return self.supervisor.nats_url

    async def start(self) -> None:
        await self.supervisor.start()
        self._watch = asyncio.ensure_future(self.supervisor.watch(self._stop))

    def pid(self, name: str) -> int | None:
        proc = self.supervisor.children[name].proc
        if proc is None or proc.returncode is not None:
            return None
        self.pids.add(proc.pid)
        return proc.pid

    async def running_pid(self, name: str, timeout_s: float = 60.0) -> int:
        async with asyncio.timeout(timeout_s):
            while (pid := self.pid(name)) is None:
                await asyncio.sleep(0.05)
        return pid

    async def shutdown(self) -> None:
        self._stop.set()
        if self._watch is not None:
            await self._watch
            self._watch = None
        await self.supervisor.stop()

    def left(self) -> list[int]:
        return sorted(pid for pid in self.pids if alive(pid))


@contextlib.asynccontextmanager
async def running_stack(
    run_dir: Path, env: dict[str, str], services: tuple[str, ...] = SERVICES, **overrides: Any
) -> AsyncIterator[Stack]:
    """The stack on a free port; ``overrides`` replace fields of its StackSettings."""
    settings = StackSettings(
        run_dir=run_dir,
        nats_port=free_port(),
        services=services,
        restart_backoff_s=0.3,
        max_backoff_s=2.0,
        stop_grace_s=30.0,
        env=env,
    )
    settings = dataclasses.replace(settings, **overrides)
    stack = Stack(settings)
    try:
        await stack.start()
        yield stack
    finally:
        await stack.shutdown()


@contextlib.asynccontextmanager
async def connected(url: str, timeout_s: float = 60.0) -> AsyncIterator[NATS]:
    """A test client that waits for a restarting nats-server instead of failing at once.

    Only connecting is tried again: what the caller's block raises (a timeout is an
    ``OSError`` too) goes to the caller.
    """
    deadline = time.monotonic() + timeout_s
    async with contextlib.AsyncExitStack() as held:
        while True:
            try:
                nc = await held.enter_async_context(client(url))
                break
            except (OSError, nats.errors.NoServersError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)
        yield nc


def make_tasks(count: int, seed: int, max_tokens: int = 12) -> list[Task]:
    from services.domains import load_registry

    domain = load_registry(None).get(DOMAIN)
    tasks = domain.make_tasks(count, split="train", seed=seed)
    return [
        msgspec.structs.replace(
            task, n=GROUP, sampling=msgspec.structs.replace(task.sampling, max_tokens=max_tokens)
        )
        for task in tasks
    ]


async def submit(nc: NATS, tasks: list[Task], timeout_s: float = 60.0) -> None:
    """Publish every task, retrying through a server restart (the msg id dedups retries)."""
    js = nc.jetstream()
    for task in tasks:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await js.publish(
                    subjects.of_task(task),
                    encode(task),
                    headers={"Nats-Msg-Id": task.id},
                    timeout=2.0,
                )
                break
            except (nats.errors.Error, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)


@dataclass(kw_only=True)
class Scored:
    ids: set[str] = field(default_factory=set)
    #: Rollouts that may enter training (status scored).
    trainable: set[str] = field(default_factory=set)


async def read_stream(nc: NATS, stream: str, subject: str) -> list[bytes]:
    """Every message the stream holds on ``subject``, oldest first."""
    js = nc.jetstream()
    info = await js.stream_info(stream)
    if not info.state.messages:
        return []
    sub = await js.subscribe(
        subject, ordered_consumer=True, deliver_policy=nats.js.api.DeliverPolicy.ALL
    )
    out: list[bytes] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=2.0)
            except TimeoutError:
                return out
            out.append(msg.data)
            if msg.metadata.num_pending == 0:
                return out
    finally:
        await sub.unsubscribe()


async def scored(url: str) -> Scored:
    codec: Codec[ScoredRollout] = Codec(ScoredRollout)
    result = Scored()
    async with connected(url) as nc:
        for data in await read_stream(nc, streams.SCORED.name, subjects.scored_all()):
            item = codec.decode(data)
            result.ids.add(item.id)
            if item.status == "scored":
                result.trainable.add(item.id)
    return result


async def policy_updates(url: str) -> list[PolicyUpdate]:
    codec: Codec[PolicyUpdate] = Codec(PolicyUpdate)
    async with connected(url) as nc:
        raw = await read_stream(nc, streams.POLICY.name, subjects.policy_update())
    return [codec.decode(data) for data in raw]


async def generator_versions(url: str, wait_s: float = 3.0) -> dict[str, float]:
    """The policy version each live generator instance reports in its stats."""
    codec: Codec[Stats] = Codec(Stats)
    seen: dict[str, float] = {}
    async with connected(url) as nc:
        sub = await nc.subscribe(subjects.stats("generator"))
        deadline = time.monotonic() + wait_s
        with contextlib.suppress(TimeoutError):
            while (left := deadline - time.monotonic()) > 0:
                stats = codec.decode((await sub.next_msg(timeout=left)).data)
                seen[stats.instance] = stats.values.get("policy_version", -1.0)
        await sub.unsubscribe()
    return seen
