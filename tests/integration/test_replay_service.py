"""The replay service over a real nats-server: scored stream in, batches out, held
rollouts acked only when they leave and handed back on stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as NATS

from protocol import streams, subjects
from protocol.codec import Codec, encode
from protocol.messages import (
    Batch,
    BatchCommit,
    BatchStatus,
    CommitReply,
    LeaseRelease,
    SampleRequest,
    ScoredRollout,
)
from services.replay.service import DURABLE, ReplayService, ReplaySettings
from tests.integration.support import client, runtime
from tests.unit.test_replay_buffer import scored

BATCH: Codec[Batch] = Codec(Batch)


def _settings(url: str, instance: str = "replay-test", **overrides: object) -> ReplaySettings:
    values: dict[str, object] = {"runtime": runtime(url, instance=instance)}
    values.update(overrides)
    return ReplaySettings(**values)  # type: ignore[arg-type]


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    async with client(nats_url) as conn:
        yield conn


async def _publish(nc: NATS, items: list[ScoredRollout]) -> None:
    js = nc.jetstream()
    for item in items:
        subject = subjects.scored(item.rollout.task.domain, item.rollout.task.id)
        trace = {"Temper-Trace-Id": f"trace-{item.id}"}
        await js.publish(subject, encode(item), headers={"Nats-Msg-Id": item.id, **trace})


async def _sample(nc: NATS, **fields: object) -> Batch:
    values: dict[str, object] = {"id": "r1", "learner_version": 0, "max_samples": 8}
    values.update(fields)
    reply = await nc.request(
        subjects.replay_sample(),
        encode(SampleRequest(**values)),
        timeout=10,  # type: ignore[arg-type]
    )
    return BATCH.decode(reply.data)


async def _pending_acks(nc: NATS) -> int:
    info = await nc.jetstream().consumer_info(streams.SCORED.name, DURABLE)
    return int(info.num_ack_pending)


async def _until_held(service: ReplayService, count: int) -> None:
    async with asyncio.timeout(10):
        while len(service.buffer) < count:
            await asyncio.sleep(0.02)


async def test_whole_groups_are_served_and_acked_only_then(nats_url: str, nc: NATS) -> None:
    async with ReplayService(_settings(nats_url)) as service:
        await _publish(nc, [scored("a", 0), scored("a", 1), scored("b", 0)])
        await _until_held(service, 3)
        assert await _pending_acks(nc) == 3
        batch = await _sample(nc)
        assert batch.status is BatchStatus.PARTIAL
        assert sorted(i.id for i in batch.items) == ["a/0", "a/1"]
        assert batch.remaining == 1
        async with asyncio.timeout(10):
            while await _pending_acks(nc) != 1:
                await asyncio.sleep(0.05)


async def test_a_request_waits_for_the_batch_to_fill(nats_url: str, nc: NATS) -> None:
    async with ReplayService(_settings(nats_url)):
        asking = asyncio.ensure_future(_sample(nc, max_samples=2, wait_s=5))
        await asyncio.sleep(0.3)
        assert not asking.done()
        await _publish(nc, [scored("w", 0), scored("w", 1)])
        batch = await asking
    assert batch.status is BatchStatus.OK
    assert len(batch.items) == 2


async def test_a_batch_below_min_samples_stays_in_the_buffer(nats_url: str, nc: NATS) -> None:
    async with ReplayService(_settings(nats_url)) as service:
        await _publish(nc, [scored("m", 0), scored("m", 1)])
        await _until_held(service, 2)
        short = await _sample(nc, max_samples=4, min_samples=4, wait_s=0.3)
        assert (short.status, short.items) == (BatchStatus.EMPTY, [])
        assert len(service.buffer) == 2 and await _pending_acks(nc) == 2
        asking = asyncio.ensure_future(_sample(nc, max_samples=4, min_samples=4, wait_s=5))
        await _publish(nc, [scored("n", 0), scored("n", 1)])
        batch = await asking
    assert batch.status is BatchStatus.OK
    assert sorted(i.id for i in batch.items) == ["m/0", "m/1", "n/0", "n/1"]
    assert service.statistics()["count_hold"] == 4


async def test_stale_rollouts_are_dropped_and_counted(nats_url: str, nc: NATS) -> None:
    async with ReplayService(_settings(nats_url, max_staleness=1)) as service:
        await _publish(nc, [scored("s", 0, version=0), scored("s", 1, version=0)])
        await _until_held(service, 2)
        batch = await _sample(nc, learner_version=3)
        assert (batch.status, batch.dropped_stale) == (BatchStatus.EMPTY, 2)
        assert service.statistics()["dropped_stale"] == 2


async def test_held_rollouts_go_back_on_stop_and_a_new_instance_serves_them(
    nats_url: str, nc: NATS
) -> None:
    async with ReplayService(_settings(nats_url)) as service:
        await _publish(nc, [scored("k", 0), scored("k", 1)])
        await _until_held(service, 2)
    # Stopped without serving: nothing was acked, the next instance gets both at once.
    async with ReplayService(_settings(nats_url, instance="replay-2")) as second:
        await _until_held(second, 2)
        batch = await _sample(nc)
    assert sorted(i.id for i in batch.items) == ["k/0", "k/1"]


async def test_a_full_buffer_stops_taking_instead_of_dropping(nats_url: str, nc: NATS) -> None:
    async with ReplayService(_settings(nats_url, capacity=2)) as service:
        await _publish(nc, [scored(f"f{i}", 0, n=1) for i in range(5)])
        await _until_held(service, 2)
        await asyncio.sleep(0.5)
        assert len(service.buffer) == 2
        first = await _sample(nc, max_samples=5)
        assert len(first.items) == 2
        await _until_held(service, 2)
        second = await _sample(nc, max_samples=5)
    assert len(second.items) == 2
    assert {i.id for i in first.items}.isdisjoint(i.id for i in second.items)


COMMIT_REPLY: Codec[CommitReply] = Codec(CommitReply)


async def _commit(nc: NATS, request: BatchCommit | LeaseRelease) -> CommitReply:
    reply = await nc.request(subjects.replay_commit(), encode(request), timeout=10)
    return COMMIT_REPLY.decode(reply.data)


async def _until_pending(nc: NATS, count: int) -> None:
    async with asyncio.timeout(10):
        while await _pending_acks(nc) != count:
            await asyncio.sleep(0.05)


async def test_a_leased_batch_stays_unacked_until_its_commit(nats_url: str, nc: NATS) -> None:
    async with ReplayService(_settings(nats_url)) as service:
        await _publish(nc, [scored("l", 0), scored("l", 1), scored("o", 0), scored("o", 1)])
        await _until_held(service, 4)
        batch = await _sample(nc, max_samples=2, lease=True)
        ids = [i.id for i in batch.items]
        assert batch.traces == {i: f"trace-{i}" for i in ids}
        await asyncio.sleep(0.3)
        assert await _pending_acks(nc) == 4, "served under a lease: nothing acked yet"
        reply = await _commit(nc, BatchCommit(id="c1", rollout_ids=[*ids, "nobody/0"]))
        assert (reply.committed, reply.unknown) == (2, 1)
        await _until_pending(nc, 2)
        again = await _commit(nc, BatchCommit(id="c2", rollout_ids=ids))
        assert (again.committed, again.unknown) == (0, 2)


async def test_a_lease_release_serves_the_uncommitted_again(nats_url: str, nc: NATS) -> None:
    async with ReplayService(_settings(nats_url)) as service:
        await _publish(nc, [scored("r", 0), scored("r", 1)])
        await _until_held(service, 2)
        first = await _sample(nc, lease=True)
        assert (await _sample(nc, lease=True, id="r2")).items == []
        released = await _commit(nc, LeaseRelease(id="x", learner="lrn-1"))
        assert released.released == 2
        second = await _sample(nc, lease=True, id="r3")
    assert sorted(i.id for i in second.items) == sorted(i.id for i in first.items)
    assert service.statistics()["released"] == 2
