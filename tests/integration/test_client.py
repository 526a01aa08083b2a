"""TemperClient against a real nats-server with the stack's streams declared."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from protocol import (
    DecodeError,
    ErrorCode,
    PayloadTooLarge,
    RemoteError,
    headers,
    streams,
    subjects,
)
from protocol.client import Receipt, StackUnavailable, TemperClient
from protocol.codec import Codec, encode
from protocol.messages import (
    ChatMessage,
    ErrorReply,
    Heartbeat,
    Rollout,
    ScoredRollout,
    ServiceState,
    ServiceStatus,
    StackStatus,
    StatusRequest,
    StreamStatus,
    Task,
    rollout_id,
)
from services.runtime.jetstream import ensure_streams
from services.runtime.natsserver import NatsServer

pytestmark = pytest.mark.integration

TASK: Codec[Task] = Codec(Task)
STATUS_REQUEST: Codec[StatusRequest] = Codec(StatusRequest)


def make_task(task_id: str = "t1", *, tier: int = 1, attempt: int = 0, **extra: Any) -> Task:
    return Task(
        id=task_id,
        domain="arithmetic",
        tier=tier,
        attempt=attempt,
        prompt=[ChatMessage(role="user", content="What is 17 + 25?")],
        **{"metadata": {"answer": "42"}, **extra},
    )


def make_scored(task: Task, sample: int, reward: float = 1.0) -> ScoredRollout:
    rollout = Rollout(id=rollout_id(task.id, sample), task=task, sample_index=sample)
    return ScoredRollout(id=rollout.id, rollout=rollout, reward=reward, validator="test")


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    """A plain nats-py connection, playing the services' side."""
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


@pytest.fixture
async def js(nc: NATS) -> JetStreamContext:
    """JetStream with every stream of the stack declared."""
    context = nc.jetstream()
    await ensure_streams(context, streams.ALL)
    return context


@pytest.fixture
async def client(nats_url: str, js: JetStreamContext) -> AsyncIterator[TemperClient]:
    async with await TemperClient.connect(nats_url, name="test-client") as c:
        yield c


async def publish_scored(
    js: JetStreamContext, scored: ScoredRollout, msg_id: str | None = None
) -> None:
    task = scored.rollout.task
    hdrs = {headers.MSG_ID: msg_id or f"scored:{scored.id}"}
    await js.publish(subjects.scored(task.domain, task.id), encode(scored), headers=hdrs)


async def stream_count(js: JetStreamContext, name: str) -> int:
    info = await js.stream_info(name)
    return int(info.state.messages)


async def task_stream_counts(js: JetStreamContext) -> list[int]:
    return [await stream_count(js, spec.name) for spec in streams.TASK_STREAMS]


# --------------------------------------------------------------------------- submit


async def test_submit_lands_in_its_tier_stream_with_headers(
    client: TemperClient, js: JetStreamContext
) -> None:
    task = make_task(tier=0)
    receipt = await client.submit(task, trace_id="trace-abc")

    assert receipt == Receipt(
        task_id="t1", trace_id="trace-abc", stream="TEMPER_TASKS_0", seq=1, duplicate=False
    )
    assert await task_stream_counts(js) == [1, 0, 0, 0]
    stored = await js.get_msg("TEMPER_TASKS_0", 1)
    assert stored.subject == subjects.task(0, "arithmetic")
    assert stored.data is not None
    assert TASK.decode(stored.data) == task
    assert stored.headers is not None
    assert stored.headers[headers.MSG_ID] == "task:t1:0"
    assert stored.headers[headers.TRACE_ID] == "trace-abc"
    assert stored.headers[headers.VERSION] == "1"


async def test_submit_generates_a_trace_id_and_honours_a_msg_id(
    client: TemperClient, js: JetStreamContext
) -> None:
    receipt = await client.submit(make_task(tier=3), msg_id="custom-1")
    assert receipt.stream == "TEMPER_TASKS_3"
    assert len(receipt.trace_id) == 32
    stored = await js.get_msg("TEMPER_TASKS_3", receipt.seq)
    assert stored.headers is not None
    assert stored.headers[headers.TRACE_ID] == receipt.trace_id
    assert stored.headers[headers.MSG_ID] == "custom-1"


async def test_resubmission_is_deduplicated_but_a_new_attempt_is_not(
    client: TemperClient, js: JetStreamContext
) -> None:
    first = await client.submit(make_task())
    again = await client.submit(make_task())
    assert not first.duplicate
    assert again.duplicate
    assert again.seq == first.seq
    assert await stream_count(js, "TEMPER_TASKS_1") == 1

    retry = await client.submit(make_task(attempt=1))
    assert not retry.duplicate
    assert retry.seq == first.seq + 1
    assert await stream_count(js, "TEMPER_TASKS_1") == 2


async def test_oversized_task_is_refused_before_publishing(
    client: TemperClient, js: JetStreamContext
) -> None:
    limit = client.nc.max_payload
    with pytest.raises(PayloadTooLarge) as caught:
        await client.submit(make_task(metadata={"blob": "x" * limit}))
    assert caught.value.limit == limit
    assert await task_stream_counts(js) == [0, 0, 0, 0]

    # The connection survived (the server would have closed it on an oversized PUB).
    receipt = await client.submit(make_task("t2"))
    assert receipt.seq == 1
    assert client.nc.is_connected


async def test_headers_count_towards_the_size_limit(
    client: TemperClient, js: JetStreamContext
) -> None:
    limit = client.nc.max_payload
    base = len(TASK.encode(make_task(metadata={"blob": ""})))
    task = make_task(metadata={"blob": "x" * (limit - base - 8)})
    assert len(TASK.encode(task)) < limit
    with pytest.raises(PayloadTooLarge):
        await client.submit(task)
    assert await task_stream_counts(js) == [0, 0, 0, 0]


async def test_invalid_task_is_refused_before_publishing(
    client: TemperClient, js: JetStreamContext
) -> None:
    with pytest.raises(ValueError, match="domain"):
        await client.submit(Task(id="t1", domain="bad.domain", prompt_tokens=b"\0\0\0\0"))
    with pytest.raises(DecodeError, match=r"\$\.n"):
        await client.submit(make_task(n=5000))
    assert await task_stream_counts(js) == [0, 0, 0, 0]


async def test_submit_without_streams_raises_stack_unavailable(nats_url: str) -> None:
    async with await TemperClient.connect(nats_url) as client:
        started = time.monotonic()
        with pytest.raises(StackUnavailable, match="temper up") as caught:
            await client.submit(make_task())
        assert "stream" in str(caught.value)
        assert time.monotonic() - started < 2.0


async def test_connect_to_nothing_raises_stack_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(StackUnavailable, match="temper up"):
        await TemperClient.connect(f"nats://127.0.0.1:{port}", connect_timeout_s=1.0)
    assert time.monotonic() - started < 3.0


async def test_submit_many_keeps_order_and_checks_everything_first(
    client: TemperClient, js: JetStreamContext
) -> None:
    tasks = [make_task(f"m{i}", tier=i % 4) for i in range(20)]
    receipts = await client.submit_many(tasks, concurrency=4)
    assert [r.task_id for r in receipts] == [t.id for t in tasks]
    assert [r.stream for r in receipts] == [f"TEMPER_TASKS_{i % 4}" for i in range(20)]
    assert len({r.trace_id for r in receipts}) == 20
    assert await task_stream_counts(js) == [5, 5, 5, 5]

    huge = make_task("huge", metadata={"blob": "x" * client.nc.max_payload})
    with pytest.raises(PayloadTooLarge):
        await client.submit_many([make_task("n1"), huge])
    assert await task_stream_counts(js) == [5, 5, 5, 5]
    assert all(r.duplicate for r in await client.submit_many(tasks))


# --------------------------------------------------------------------------- results


async def test_wait_scored_sees_results_from_before_and_after_the_call(
    client: TemperClient, js: JetStreamContext
) -> None:
    task, other = make_task("t1", n=3), make_task("t1x")
    await publish_scored(js, make_scored(task, 0))
    await publish_scored(js, make_scored(task, 1))
    waiter = asyncio.create_task(client.wait_scored("t1", 3, timeout_s=10))
    await asyncio.sleep(0.2)
    # Another task's results arrive first: they must not count.
    for sample in range(3):
        await publish_scored(js, make_scored(other, sample))
    assert not waiter.done()
    await publish_scored(js, make_scored(task, 2))

    results = await waiter
    assert sorted(r.id for r in results) == ["t1/0", "t1/1", "t1/2"]
    assert all(r.rollout.task == task for r in results)


async def test_wait_scored_counts_a_rollout_scored_twice_once(
    client: TemperClient, js: JetStreamContext
) -> None:
    task = make_task()
    await publish_scored(js, make_scored(task, 0, reward=1.0), msg_id="a")
    await publish_scored(js, make_scored(task, 0, reward=0.5), msg_id="b")
    await publish_scored(js, make_scored(task, 1))
    assert await client.task_progress("t1") == 3

    results = await client.wait_scored("t1", 2, timeout_s=5)
    assert [r.id for r in results] == ["t1/0", "t1/1"]
    assert results[0].reward == 1.0

    started = time.monotonic()
    with pytest.raises(TimeoutError, match="2 of 3"):
        await client.wait_scored("t1", 3, timeout_s=0.5)
    assert time.monotonic() - started < 3.0


async def test_scored_skips_undecodable_messages_and_cleans_up(
    client: TemperClient, js: JetStreamContext, caplog: pytest.LogCaptureFixture
) -> None:
    task = make_task()
    await js.publish(subjects.scored("arithmetic", "t1"), b"\xc1 not msgpack")
    await publish_scored(js, make_scored(task, 0))
    with caplog.at_level(logging.WARNING, logger="protocol.client"):
        results = [r async for r in client.scored("t1", timeout_s=0.5)]
    assert [r.id for r in results] == ["t1/0"]
    assert "undecodable" in caplog.text
    info = await js.stream_info(streams.SCORED.name)
    assert info.state.consumer_count == 0


async def test_leaving_scored_early_deletes_its_consumer(
    client: TemperClient, js: JetStreamContext
) -> None:
    task = make_task()
    for sample in range(3):
        await publish_scored(js, make_scored(task, sample))
    seen = []
    async with contextlib.aclosing(client.scored("t1", timeout_s=5)) as results:
        async for rollout in results:
            seen.append(rollout.id)
            assert (await js.stream_info(streams.SCORED.name)).state.consumer_count == 1
            break
    assert seen == ["t1/0"]
    assert (await js.stream_info(streams.SCORED.name)).state.consumer_count == 0


async def test_scored_without_the_stream_raises_stack_unavailable(nats_url: str) -> None:
    async with await TemperClient.connect(nats_url) as client:
        with pytest.raises(StackUnavailable, match="TEMPER_SCORED"):
            await client.wait_scored("t1", 1, timeout_s=1)
        with pytest.raises(StackUnavailable, match="TEMPER_SCORED"):
            await client.task_progress("t1")


async def test_task_progress_counts_only_that_task_across_domains(
    client: TemperClient, js: JetStreamContext
) -> None:
    assert await client.task_progress("t1") == 0
    task = make_task()
    other_domain = msgspec.structs.replace(task, domain="code")
    await publish_scored(js, make_scored(task, 0))
    await publish_scored(js, make_scored(task, 1))
    await publish_scored(js, make_scored(other_domain, 2))
    await publish_scored(js, make_scored(make_task("t10"), 0))
    await publish_scored(js, make_scored(make_task("t"), 0))
    assert await client.task_progress("t1") == 3
    assert await client.task_progress("t10") == 1


# --------------------------------------------------------------------------- control


async def reply_with(nc: NATS, subject: str, payload: bytes) -> None:
    async def answer(msg: Msg) -> None:
        STATUS_REQUEST.decode(msg.data)  # the client sent a real StatusRequest
        await msg.respond(payload)

    await nc.subscribe(subject, cb=answer)
    await settle(nc)


async def settle(nc: NATS) -> None:
    """Twice: nats-py's flush PING can overtake a SUB still queued for its flusher."""
    await nc.flush()
    await nc.flush()


async def test_status_returns_the_control_services_answer(client: TemperClient, nc: NATS) -> None:
    expected = StackStatus(
        services=[
            ServiceStatus(
                service="generator",
                instance="g1",
                state=ServiceState.RUNNING,
                healthy=True,
                age_s=1.5,
            )
        ],
        streams=[StreamStatus(name="TEMPER_TASKS_0", messages=3, bytes=120, consumers=1)],
        at=123.0,
    )
    await reply_with(nc, subjects.status(), encode(expected))
    assert await client.status() == expected


async def test_status_error_reply_raises_remote_error(client: TemperClient, nc: NATS) -> None:
    refusal = ErrorReply(code=ErrorCode.INTERNAL, message="store offline", field="$.store")
    await reply_with(nc, subjects.status(), encode(refusal))
    with pytest.raises(RemoteError, match="store offline") as caught:
        await client.status()
    assert caught.value.code == ErrorCode.INTERNAL
    assert caught.value.field == "$.store"


async def test_status_without_control_service_raises_stack_unavailable(
    client: TemperClient,
) -> None:
    with pytest.raises(StackUnavailable, match="no control service answered"):
        await client.status(timeout_s=0.5)


async def test_ping_gathers_every_heartbeat(client: TemperClient, nc: NATS) -> None:
    for instance in ("a", "b"):
        beat = Heartbeat(
            service="generator", instance=instance, state=ServiceState.RUNNING, healthy=True
        )
        payload = encode(beat)

        async def answer(msg: Msg, payload: bytes = payload) -> None:
            await msg.respond(payload)

        await nc.subscribe(subjects.ping(), cb=answer)

    async def garbage(msg: Msg) -> None:
        await msg.respond(b"\xc1")

    await nc.subscribe(subjects.ping(), cb=garbage)
    await settle(nc)

    beats = await client.ping(timeout_s=0.5)
    assert sorted(b.instance for b in beats) == ["a", "b"]
    assert all(b.service == "generator" for b in beats)


async def test_ping_with_nobody_listening_returns_nothing(client: TemperClient) -> None:
    started = time.monotonic()
    assert await client.ping(timeout_s=0.3) == []
    assert 0.25 < time.monotonic() - started < 2.0


async def test_close_is_idempotent(nats_url: str) -> None:
    client = await TemperClient.connect(nats_url)
    await client.close()
    await client.close()
    assert client.nc.is_closed


async def test_close_after_the_server_died_raises_nothing(nats_server: NatsServer) -> None:
    """A client closed while it reconnects, with messages buffered for the dead server:
    nats-py's flush into the shut socket must not surface as a traceback on exit."""
    client = await TemperClient.connect(nats_server.url, reconnect_s=30)
    nats_server.kill()
    async with asyncio.timeout(10):
        while not client.nc.is_reconnecting:
            await asyncio.sleep(0.01)
    await client.nc.publish("temper.test.pending", b"x" * 64)
    await client.close()
    assert client.nc.is_closed
