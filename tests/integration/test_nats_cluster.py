"""A stack on a three-server JetStream cluster with every stream in three copies.

Mid-run, the server leading most of the streams the work flows through (tasks,
rollouts, scored) is killed with ``kill -9`` and kept down while more tasks arrive.
Without it the stack must finish everything: every task scored while the server is
still down, every rollout trained exactly once (by the ledger), no dead letters.  The
longest pause in scored output is printed next to the cluster's election timeout.
Then the supervisor restarts the server, and it catches up with the other two.

With one copy per stream the killed server takes its streams down with it, and the
work submitted after the kill waits for its restart: this test then fails.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import nats.errors
import nats.js.api
import pytest
from nats.aio.client import Client as NATS

from protocol import streams, subjects
from protocol.client import TemperClient
from protocol.messages import DEFAULT_TIER, Task
from protocol.servers import server_list
from services.learner.ledger_check import check
from services.runtime.jetstream import ensure_streams
from services.runtime.natscluster import ELECTION_TIMEOUT_S, NatsCluster, NatsClusterSettings
from services.runtime.natsserver import RANDOM_PORT
from tests.integration.chaos import (
    GROUP,
    Stack,
    connected,
    make_tasks,
    running_stack,
    scored,
    stack_env,
    submit,
)

SERVERS = 3
REPLICAS = 3
TASKS_BEFORE = 16
TASKS_AFTER = 24
#: Tasks after the kill arrive a few at a time, so the stack has work all through it.
CHUNK = 4
CHUNK_EVERY_S = 1.0
#: The killed server stays down this long (the stack's restart back-off, which a service
#: crashing meanwhile gets too): the work must be done by then, without it, also on a
#: machine busy with other tests.
DOWN_S = 40.0
#: Generous: three of the longest elections.  One copy per stream stalls until the restart.
PAUSE_BOUND_S = 3 * ELECTION_TIMEOUT_S[1]
#: The streams every task passes through.
PIPELINE = (streams.task_stream_name(DEFAULT_TIER), streams.ROLLOUTS.name, streams.SCORED.name)
SEED = 20261216
pytestmark = pytest.mark.timeout(300)


async def test_a_declaration_asking_fewer_copies_keeps_the_streams_copies(tmp_path: Path) -> None:
    """A service started without the replica setting must not scale the streams down."""
    settings = NatsClusterSettings.consecutive(tmp_path, SERVERS, port=RANDOM_PORT, route_port=0)
    async with NatsCluster(settings) as cluster:
        assert server_list(cluster.url) == cluster.urls and len(cluster.urls) == SERVERS
        async with connected(cluster.url) as nc:
            js = nc.jetstream()
            await ensure_streams(js, streams.with_replicas(streams.ALL, REPLICAS))
            await ensure_streams(js, streams.ALL)
            assert await _replicas(nc) == {spec.name: REPLICAS for spec in streams.ALL}
        async with await TemperClient.connect(cluster.url) as temper:
            assert temper.nc.is_connected


@dataclass(frozen=True, kw_only=True)
class Outage:
    """What killing one server did: whom, and how long the stack needed to get past it."""

    server: str
    #: The pipeline streams it led when killed.
    led: list[str]
    killed_at: float
    #: All the work, the tasks submitted after the kill included, scored by then.
    done_after_s: float
    #: The longest time without a scored rollout stored, from the kill on.
    pause_s: float

    def summary(self) -> str:
        low, high = ELECTION_TIMEOUT_S
        return (
            f"killed {self.server} (leader of {', '.join(self.led)}); all scored "
            f"{self.done_after_s:.1f}s later; longest pause in scored output {self.pause_s:.1f}s; "
            f"election timeout {low:g}-{high:g}s"
        )


async def test_losing_a_server_mid_run_loses_nothing(tmp_path: Path, tiny_model: Path) -> None:
    tasks = make_tasks(TASKS_BEFORE + TASKS_AFTER, seed=SEED)
    ledger = tmp_path / "learner" / "ledger.jsonl"
    async with running_stack(
        tmp_path,
        stack_env(tiny_model, tmp_path),
        nats_port=RANDOM_PORT,
        nats_cluster=SERVERS,
        nats_route_port=0,
        stream_replicas=REPLICAS,
        restart_backoff_s=DOWN_S,
        max_backoff_s=DOWN_S,
    ) as stack:
        _note_nats_pids(stack)
        async with connected(stack.url) as nc:
            assert await _replicas(nc) == {spec.name: REPLICAS for spec in streams.ALL}
            await submit(nc, tasks[:TASKS_BEFORE])
        # A quarter of the first rollouts scored: the work flows when the server dies.
        await _until_scored(stack.url, TASKS_BEFORE, 120, "before the kill")
        outage = await _kill_and_carry_on(stack, tasks)
        print(f"\n{outage.summary()}")
        await _until_caught_up(stack, outage.server)
        print(f"{outage.server} back and caught up {time.time() - outage.killed_at:.1f}s after")
        found = await scored(stack.url)
        await _until_trained(ledger, found.trainable)
        dead = await _messages(stack.url, streams.DEAD_LETTERS.name)
        await stack.shutdown()
    assert outage.pause_s < PAUSE_BOUND_S, f"{outage.summary()}; supervisor: {stack.lines}"
    assert len(found.ids) == len(tasks) * GROUP, "every task scored, every sample"
    assert dead == 0, "no dead letters"
    report = check(ledger)
    assert report.trained_twice == [] and report.lost == [], report.summary()
    assert report.uncommitted == [], report.summary()
    assert report.trained_ids == found.trainable, "none lost: every trainable rollout trained"
    assert stack.left() == [], f"processes left: {stack.left()}"


async def _kill_and_carry_on(stack: Stack, tasks: list[Task]) -> Outage:
    """Kill the server leading most of the pipeline, submit the rest, wait for every score."""
    victim, led = await _leader_of_most(stack.url)
    killed_at = time.time()
    os.kill(_pid(stack, victim), signal.SIGKILL)
    await _feed(stack.url, tasks[TASKS_BEFORE:])
    left_s = killed_at + DOWN_S - time.time()
    await _until_scored(stack.url, len(tasks) * GROUP, left_s, f"while {victim} was down")
    done_after_s = time.time() - killed_at
    assert not stack.supervisor.nats_servers[victim].running, "done while it was down"
    pause_s = await _longest_pause(stack.url, killed_at)
    return Outage(
        server=victim, led=led, killed_at=killed_at, done_after_s=done_after_s, pause_s=pause_s
    )


def _note_nats_pids(stack: Stack) -> None:
    for server in stack.supervisor.nats_servers.values():
        if server.pid is not None:
            stack.pids.add(server.pid)


def _pid(stack: Stack, server: str) -> int:
    pid = stack.supervisor.nats_servers[server].pid
    assert pid is not None, f"{server} is not running"
    return pid


async def _replicas(nc: NATS) -> dict[str, int | None]:
    js = nc.jetstream()
    return {
        spec.name: (await js.stream_info(spec.name)).config.num_replicas for spec in streams.ALL
    }


async def _leader_of_most(url: str) -> tuple[str, list[str]]:
    """The server leading most of the pipeline's streams, and those it leads."""
    led: dict[str, list[str]] = collections.defaultdict(list)
    async with connected(url) as nc:
        js = nc.jetstream()
        for name in PIPELINE:
            info = await js.stream_info(name)
            assert info.cluster is not None and info.cluster.leader, f"{name} has no leader"
            led[info.cluster.leader].append(name)
    victim = max(led, key=lambda server: len(led[server]))
    return victim, led[victim]


async def _feed(url: str, tasks: list[Task]) -> None:
    for start in range(0, len(tasks), CHUNK):
        async with connected(url) as nc:
            await submit(nc, tasks[start : start + CHUNK])
        await asyncio.sleep(CHUNK_EVERY_S)


async def _until_scored(url: str, count: int, timeout_s: float, when: str) -> None:
    found = 0
    try:
        async with asyncio.timeout(max(timeout_s, 0.0)):
            while (found := await _scored_count(url, found)) < count:
                await asyncio.sleep(0.5)
    except TimeoutError:
        raise AssertionError(f"{found} of {count} rollouts scored {when}") from None


async def _scored_count(url: str, before: int) -> int:
    """Rollouts scored so far; ``before`` while the stream does not answer (mid-election)."""
    try:
        return len((await scored(url)).ids)
    except (nats.errors.Error, TimeoutError):
        return before


async def _longest_pause(url: str, since: float) -> float:
    """The longest time without a scored rollout stored, from ``since`` to the last one."""
    async with connected(url) as nc:
        stored = await _stored_times(nc, streams.SCORED.name, subjects.scored_all())
    times = [since, *sorted(t for t in stored if t > since)]
    return max((later - earlier for earlier, later in itertools.pairwise(times)), default=0.0)


async def _stored_times(nc: NATS, stream: str, subject: str) -> list[float]:
    """When each message the stream holds was stored (epoch seconds)."""
    js = nc.jetstream()
    left = (await js.stream_info(stream)).state.messages
    sub = await js.subscribe(
        subject, ordered_consumer=True, deliver_policy=nats.js.api.DeliverPolicy.ALL
    )
    out: list[float] = []
    try:
        while len(out) < left:
            msg = await sub.next_msg(timeout=5.0)
            out.append(msg.metadata.timestamp.timestamp())
    finally:
        await sub.unsubscribe()
    return out


async def _until_caught_up(stack: Stack, server: str, timeout_s: float = 60.0) -> None:
    """The supervisor restarted ``server`` and every stream has its copies current again."""
    async with asyncio.timeout(timeout_s):
        while not stack.supervisor.nats_servers[server].running:
            await asyncio.sleep(0.2)
        _note_nats_pids(stack)
        assert stack.supervisor.nats_record(server).restarts == 1
        async with connected(stack.url) as nc:
            while not await _all_current(nc):
                await asyncio.sleep(0.5)


async def _all_current(nc: NATS) -> bool:
    js = nc.jetstream()
    for spec in streams.ALL:
        cluster = (await js.stream_info(spec.name)).cluster
        peers = cluster.replicas or [] if cluster is not None else []
        if len(peers) != REPLICAS - 1 or not all(peer.current for peer in peers):
            return False
    return True


async def _until_trained(ledger: Path, trainable: set[str], timeout_s: float = 120.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not ledger.exists() or not check(ledger).trained_ids >= trainable:
            await asyncio.sleep(1.0)


async def _messages(url: str, stream: str) -> int:
    async with connected(url) as nc:
        return int((await nc.jetstream().stream_info(stream)).state.messages)
