"""Fair intake on a real nats-server: per-flow durables of a tier stream (a domain's tasks of
one tenant), taken in weighted fair share, a quarantined domain's tasks held in the stream,
and the tier-wide durable of FIFO intake retired without losing its unacknowledged tasks."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from protocol import streams, subjects
from protocol.codec import Codec, encode
from protocol.messages import ChatMessage, Task
from services.generator.scheduling.fairshare import FairShare, Flow
from services.generator.scheduling.intake import (
    DURABLE,
    MAX_DURABLE_LEN,
    DomainSource,
    Fairness,
    flow_durable,
    retire_tier_durable,
)
from services.generator.scheduling.quarantine import Quarantine, QuarantineSettings
from services.runtime.jetstream import ConsumerSpec, ensure_consumer, ensure_streams
from tests.integration.support import client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TIER = 1
STREAM = streams.TASK_STREAMS[TIER].name
SPEC = ConsumerSpec(stream=STREAM, durable=DURABLE, ack_wait_s=30, max_deliver=5)
TASKS: Codec[Task] = Codec(Task)


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    async with client(nats_url) as conn:
        await ensure_streams(conn.jetstream(), streams.TASK_STREAMS)
        yield conn


async def publish(js: JetStreamContext, domain: str, count: int, tenant: str = "") -> None:
    for i in range(count):
        task = Task(
            id=f"{domain[:8]}-{tenant[:8]}-{i}" if tenant else f"{domain}-{i}",
            domain=domain,
            tenant=tenant,
            prompt=[ChatMessage(role="user", content=str(i))],
        )
        await js.publish(subjects.task(TIER, domain, tenant), encode(task))


async def take(source: DomainSource, count: int) -> list[Msg]:
    """``count`` tasks, one fetch at a time as a busy generator takes them; each acked."""
    got: list[Msg] = []
    while len(got) < count:
        batch = await source.fetch(1, 1.0)
        assert batch, f"nothing to fetch after {len(got)}"
        for msg in batch:
            await msg.ack()
        got.extend(batch)
    return got


def domains(msgs: list[Msg]) -> Counter[str]:
    return Counter(TASKS.decode(m.data).domain for m in msgs)


def flows(msgs: list[Msg]) -> Counter[str]:
    """``domain`` or ``domain/tenant`` per task, as ``str(Flow)`` writes them."""
    return Counter(str(Flow(t.domain, t.tenant)) for t in map(TASKS.decode, (m.data for m in msgs)))


async def test_a_ten_to_one_flood_does_not_starve_the_other_domain(nc: NATS) -> None:
    js = nc.jetstream()
    await publish(js, "flood", 200)
    await publish(js, "quiet", 20)  # behind the whole flood in stream order
    fair = Fairness(share=FairShare({"quiet": 1.0, "flood": 1.0}), quarantine=Quarantine())
    source = DomainSource(nc, js, SPEC, TIER, fair)
    try:
        first = await take(source, 40)
    finally:
        assert await source.close() == []
    assert domains(first) == {"flood": 20, "quiet": 20}
    names = {c.name for c in await js.consumers_info(STREAM)}
    assert names == {flow_durable(Flow("flood")), flow_durable(Flow("quiet"))}


async def test_a_tenant_flood_does_not_starve_another_tenant_of_its_domain(nc: NATS) -> None:
    """The tenants of a domain split its share of the tier; each flow has a durable the
    server takes: ``~`` in its name, at the 255-character limit, or past it (a digest)."""
    js = nc.jetstream()
    at_limit = Flow("e" * 116, "t" * 128)
    past_limit = Flow("d" * 128, "t" * 128)
    await publish(js, "maths", 200, tenant="big")
    await publish(js, "maths", 20, tenant="small")  # behind the flood in stream order
    for flow in (at_limit, past_limit):
        await publish(js, flow.domain, 20, flow.tenant)
    await publish(js, "code", 60)  # the default tenant
    source = DomainSource(nc, js, SPEC, TIER, Fairness(share=FairShare(), quarantine=Quarantine()))
    try:
        got = flows(await take(source, 40))
    finally:
        await source.close()
    # Four domains, a quarter each; maths's two tenants half of its quarter each.
    assert got == {"maths/big": 5, "maths/small": 5, "code": 10} | {
        str(flow): 10 for flow in (at_limit, past_limit)
    }
    names = {c.name for c in await js.consumers_info(STREAM)}
    assert len(flow_durable(at_limit)) == MAX_DURABLE_LEN
    assert flow_durable(past_limit).startswith(f"{DURABLE}~")
    assert {flow_durable(at_limit), flow_durable(past_limit), "generator-maths~small"} <= names


async def test_weights_set_the_shares(nc: NATS) -> None:
    js = nc.jetstream()
    await publish(js, "heavy", 60)
    await publish(js, "light", 60)
    fair = Fairness(share=FairShare({"heavy": 3.0, "light": 1.0}), quarantine=Quarantine())
    source = DomainSource(nc, js, SPEC, TIER, fair)
    try:
        got = await take(source, 40)
    finally:
        await source.close()
    assert domains(got) == {"heavy": 30, "light": 10}


async def test_a_quarantined_domain_is_held_in_the_stream_until_its_probe(nc: NATS) -> None:
    js = nc.jetstream()
    await publish(js, "broken", 10)
    await publish(js, "fine", 10)
    now = [1000.0]
    quarantine = Quarantine(QuarantineSettings(min_samples=3, probe_after_s=60.0))
    for i in range(3):
        quarantine.record("broken", f"broken/{i}", infra_failure=True, now=now[0])
    fair = Fairness(share=FairShare(), quarantine=quarantine, clock=lambda: now[0])
    source = DomainSource(nc, js, SPEC, TIER, fair)
    try:
        assert domains(await take(source, 10)) == {"fine": 10}
        assert await source.fetch(1, 0.0) == []
        info = await js.stream_info(STREAM, subjects_filter=subjects.task_tier(TIER))
        assert info.state.subjects == {subjects.task(TIER, "broken"): 10}, "held, not dropped"
        now[0] += 60.0
        [probe] = await source.fetch(5, 0.0)  # one probe, nothing more until it reports
        await probe.ack()
        assert await source.fetch(5, 0.0) == []
        quarantine.record("broken", "probe", infra_failure=False, now=now[0])
        assert domains(await take(source, 9)) == {"broken": 9}
    finally:
        await source.close()


async def test_the_tier_wide_durable_is_retired_and_its_tasks_still_served(
    nc: NATS,
) -> None:
    """Upgrading from FIFO intake: the old durable had a task in flight when it stopped."""
    js = nc.jetstream()
    await ensure_consumer(js, SPEC)
    await publish(js, "math", 3)
    old = await js.pull_subscribe_bind(DURABLE, STREAM)
    [unacked] = await old.fetch(1, timeout=2)
    assert TASKS.decode(unacked.data).id == "math-0"
    await old.unsubscribe()

    assert await retire_tier_durable(js, STREAM)
    assert not await retire_tier_durable(js, STREAM)
    assert DURABLE not in {c.name for c in await js.consumers_info(STREAM)}
    source = DomainSource(nc, js, SPEC, TIER, Fairness(share=FairShare(), quarantine=Quarantine()))
    try:
        got = await take(source, 3)
    finally:
        await source.close()
    assert sorted(TASKS.decode(m.data).id for m in got) == ["math-0", "math-1", "math-2"]


async def test_an_idle_tier_waits_for_a_publish_instead_of_polling(nc: NATS) -> None:
    """Idle, the intake asks the stream for its backlog twice (before and after it starts
    listening), then only when a task is published: the idle refresh is set far beyond
    the test, so only the publish explains the pick-up."""
    fair = Fairness(share=FairShare({}), quarantine=Quarantine(), idle_refresh_s=600.0)
    source = DomainSource(nc, nc.jetstream(), SPEC, TIER, fair)
    asked: list[Msg] = []

    async def count(msg: Msg) -> None:
        asked.append(msg)

    watch = await nc.subscribe(f"$JS.API.STREAM.INFO.{STREAM}", cb=count)
    try:
        for _ in range(10):  # ten idle fetches, as a generator's consumer loop makes them
            assert await source.fetch(1, 0.2) == []
        await nc.flush()
        idle = len(asked)
        await publish(nc.jetstream(), "late", 1)
        got = await source.fetch(1, 30.0)
        assert domains(got) == Counter({"late": 1})
        await got[0].ack()
    finally:
        await watch.unsubscribe()
        await source.close()
    assert idle == 2, f"{idle} backlog requests in 2 s of idling"


async def test_a_publish_on_another_idle_tier_ends_this_tiers_wait(nc: NATS) -> None:
    """Two idle tiers of one generator: the one holding the fetch turn stops waiting as
    soon as a task is published on the other (whose turn it then is to take it), instead
    of waiting out its poll."""
    js = nc.jetstream()
    fair = Fairness(share=FairShare(), quarantine=Quarantine(), idle_refresh_s=600.0)
    fair.publishes.waiting = lambda tier: tier == TIER  # its consumer waits for the turn
    other = ConsumerSpec(stream=streams.TASK_STREAMS[3].name, durable=DURABLE, ack_wait_s=30)
    busy_tier = DomainSource(nc, js, SPEC, TIER, fair)
    idle_tier = DomainSource(nc, js, other, 3, fair)
    try:
        for source in (busy_tier, idle_tier):  # each idle once: listening for publishes
            assert await source.fetch(1, 0.2) == []
        waiting = asyncio.create_task(idle_tier.fetch(1, 60.0))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await publish(js, "urgent", 1)
        assert await asyncio.wait_for(waiting, 30.0) == []  # long before its 60 s
        got = await busy_tier.fetch(1, 5.0)
        assert domains(got) == Counter({"urgent": 1})
        await got[0].ack()
    finally:
        for source in (busy_tier, idle_tier):
            await source.close()
