"""Bus.publish_many and Bus.ack_many on a real nats-server: each item stored or failed alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats.errors
import nats.js.errors
import pytest
from nats.aio.msg import Msg

from protocol import headers as h
from protocol.errors import PayloadTooLarge
from services.runtime.bus import Bus, ConnectOptions, Publication, StreamAck, message_headers
from services.runtime.jetstream import ConsumerSpec, ensure_consumer
from services.runtime.pull import Puller
from tests.integration.support import (
    TASK_STREAM,
    TASK_SUBJECT,
    declare,
    publish_tasks,
    stream_entries,
)


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    connected = await Bus.connect(ConnectOptions(url=nats_url, name="publish-many-test"))
    await declare(connected.js)
    try:
        yield connected
    finally:
        await connected.close()


def item(msg_id: str, subject: str = TASK_SUBJECT, payload: bytes | None = None) -> Publication:
    body = payload if payload is not None else msg_id.encode()
    return Publication(subject, body, message_headers(trace_id="trace", msg_id=msg_id))


async def test_every_item_is_stored_in_order(bus: Bus) -> None:
    acks = await bus.publish_many([item(f"m{i}") for i in range(50)])
    assert all(isinstance(ack, StreamAck) for ack in acks)
    assert [ack.seq for ack in acks if isinstance(ack, StreamAck)] == list(range(1, 51))
    assert {ack.stream for ack in acks if isinstance(ack, StreamAck)} == {TASK_STREAM}
    entries = await stream_entries(bus.js, TASK_STREAM)
    assert [e.data for e in entries] == [f"m{i}".encode() for i in range(50)]
    assert (entries[0].headers or {})[h.TRACE_ID] == "trace"


async def test_a_repeated_message_id_is_stored_once(bus: Bus) -> None:
    first = await bus.publish_many([item("a"), item("b"), item("a")])
    again = await bus.publish_many([item("b"), item("c")])
    assert [getattr(ack, "duplicate", None) for ack in first] == [False, False, True]
    assert [getattr(ack, "duplicate", None) for ack in again] == [True, False]
    assert [e.data for e in await stream_entries(bus.js, TASK_STREAM)] == [b"a", b"b", b"c"]


async def test_a_subject_without_a_stream_fails_only_its_item(bus: Bus) -> None:
    acks = await bus.publish_many(
        [item("ok1"), item("lost", subject="nowhere.at.all"), item("ok2")]
    )
    assert isinstance(acks[0], StreamAck) and isinstance(acks[2], StreamAck)
    assert isinstance(acks[1], nats.js.errors.NoStreamResponseError)
    assert [e.data for e in await stream_entries(bus.js, TASK_STREAM)] == [b"ok1", b"ok2"]


async def test_an_oversized_item_is_refused_before_it_is_sent(bus: Bus) -> None:
    huge = b"x" * (bus.max_payload + 1)
    acks = await bus.publish_many([item("big", payload=huge), item("small")])
    assert isinstance(acks[0], PayloadTooLarge)
    assert isinstance(acks[1], StreamAck) and acks[1].seq == 1
    assert bus.nc.is_connected  # the server never saw it, so it kept the connection


async def test_a_refusal_by_the_stream_carries_its_error(bus: Bus) -> None:
    wrong = item("w")
    wrong.headers["Nats-Expected-Stream"] = "NOT_THIS_ONE"
    acks = await bus.publish_many([wrong, item("fine")])
    assert isinstance(acks[0], nats.js.errors.APIError)
    assert acks[0].code == 400 and acks[0].err_code == 10060
    assert isinstance(acks[1], StreamAck)


async def test_no_answer_in_time_is_a_timeout_for_that_item(bus: Bus) -> None:
    silent = await bus.nc.subscribe("silent.responder")  # takes the message, never answers
    await bus.flush()
    started = asyncio.get_running_loop().time()
    acks = await bus.publish_many([item("x", subject="silent.responder"), item("y")], timeout_s=0.3)
    assert asyncio.get_running_loop().time() - started < 2
    assert isinstance(acks[0], nats.errors.TimeoutError)
    assert isinstance(acks[1], StreamAck)
    await silent.unsubscribe()


async def test_concurrent_calls_each_get_their_own_acks(bus: Bus) -> None:
    calls = [bus.publish_many([item(f"c{k}-{i}") for i in range(20)]) for k in range(5)]
    results = await asyncio.gather(*calls)
    assert all(isinstance(ack, StreamAck) and not ack.duplicate for r in results for ack in r)
    seqs = sorted(ack.seq for r in results for ack in r if isinstance(ack, StreamAck))
    assert seqs == list(range(1, 101))
    assert await bus.publish_many([]) == []


async def test_headers_arrive_as_nats_py_would_write_them(bus: Bus) -> None:
    odd = Publication(
        TASK_SUBJECT, b"x", {"Nats-Msg-Id": "h1", " X-Note ": " two\r\nlines ", "": "-"}
    )
    [ack] = await bus.publish_many([odd])
    assert isinstance(ack, StreamAck)
    [entry] = await stream_entries(bus.js, TASK_STREAM)
    assert (entry.headers or {})["X-Note"] == "two  lines"
    assert (entry.headers or {})["Nats-Msg-Id"] == "h1"


async def test_a_bad_subject_or_header_name_fails_only_its_item(bus: Bus) -> None:
    spaced = item("s", subject=f"{TASK_SUBJECT} PUB x 1")
    named = Publication(TASK_SUBJECT, b"n", {"Bad Name": "v", "Nats-Msg-Id": "n"})
    acks = await bus.publish_many([spaced, named, item("ok")])
    assert isinstance(acks[0], nats.errors.BadSubjectError)
    assert isinstance(acks[1], nats.errors.BadHeaderError)
    assert isinstance(acks[2], StreamAck) and acks[2].seq == 1
    assert bus.nc.is_connected


async def test_a_closed_connection_fails_every_item_at_once(bus: Bus) -> None:
    await bus.publish_many([item("before")])
    await bus.nc.close()
    started = asyncio.get_running_loop().time()
    acks = await bus.publish_many([item("a"), item("b")], timeout_s=5)
    assert asyncio.get_running_loop().time() - started < 2  # no wait for acks that cannot come
    assert all(isinstance(ack, nats.errors.ConnectionClosedError) for ack in acks)


async def test_ack_many_acks_every_delivery_in_one_write(bus: Bus) -> None:
    await publish_tasks(bus.js, range(5))
    spec = ConsumerSpec(stream=TASK_STREAM, durable="ack-many", ack_wait_s=30)
    await ensure_consumer(bus.js, spec)
    puller = Puller(bus.nc, TASK_STREAM, "ack-many")
    await puller.start()
    delivered: list[Msg] = []
    async with asyncio.timeout(10):  # a loaded machine may deliver them over several pulls
        while len(delivered) < 5:
            delivered += await puller.fetch(5 - len(delivered), 1.0)
    assert len(delivered) == 5
    await bus.ack_many(delivered)
    await bus.flush()
    # The server has the acks once the flush returns; the consumer applies them just after.
    async with asyncio.timeout(10):
        while True:
            info = await bus.js.consumer_info(TASK_STREAM, "ack-many")
            if (info.num_ack_pending, info.num_pending) == (0, 0):
                break
            await asyncio.sleep(0.05)
    await puller.close()


async def test_ack_many_on_a_closed_connection_raises(bus: Bus) -> None:
    await publish_tasks(bus.js, range(1))
    await ensure_consumer(bus.js, ConsumerSpec(stream=TASK_STREAM, durable="closed", ack_wait_s=30))
    puller = Puller(bus.nc, TASK_STREAM, "closed")
    await puller.start()
    delivered = await puller.fetch(1, 1.0)
    await bus.nc.close()
    with pytest.raises(nats.errors.ConnectionClosedError):
        await bus.ack_many(delivered)
