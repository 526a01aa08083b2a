"""Bad input on a stream: an error event naming the field, a dead letter with the original bytes.

The service never crashes on input and never drops it silently.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest

from protocol import headers as h
from protocol import streams, subjects
from protocol.codec import Codec, check_size, headers_size
from protocol.errors import ErrorCode, PayloadTooLarge
from protocol.messages import ErrorEvent, Rollout, ServiceState
from services.runtime.bus import Bus, ConnectOptions
from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from tests.integration.support import (
    SERVICE_NAME,
    TASK_STREAM,
    TASK_SUBJECT,
    TASKS,
    TaskService,
    client,
    counter,
    declare,
    make_task,
    publish_tasks,
    runtime,
    wait_count,
    wait_entries,
)

DLQ_SUBJECT = subjects.dead_letter(TASK_STREAM)
EVENTS_SUBJECT = subjects.error_event(SERVICE_NAME)
SMALL_MAX_PAYLOAD = 4096


def _task_map(**changes: object) -> dict[str, object]:
    fields = msgpack.unpackb(TASKS.encode(make_task("bad")))
    fields.update(changes)
    return fields


def _without(key: str) -> dict[str, object]:
    fields = _task_map()
    del fields[key]
    return fields


GOOD = TASKS.encode(make_task("x"))
#: (name, bytes, expected code, expected field); the field is checked when not None.
BAD_INPUTS: list[tuple[str, bytes, ErrorCode, str | None]] = [
    ("random_bytes", b"\xc1\x9f\x00garbage\xff\xfe", ErrorCode.NOT_MSGPACK, None),
    ("truncated", GOOD[: len(GOOD) // 2], ErrorCode.NOT_MSGPACK, None),
    ("wrong_version", msgpack.packb(_task_map(v=2)), ErrorCode.UNSUPPORTED_VERSION, "$.v"),
    ("wrong_type", msgpack.packb(_task_map(n="x")), ErrorCode.VALIDATION, "$.n"),
    ("missing_field", msgpack.packb(_without("id")), ErrorCode.VALIDATION, "$.id"),
    (
        "wrong_message",
        Codec(Rollout).encode(Rollout(id="r1", task=make_task("r"), sample_index=0)),
        ErrorCode.VALIDATION,
        "$.type",
    ),
    (
        "unknown_tag",
        msgpack.packb(_task_map(type="no_such_type")),
        ErrorCode.UNKNOWN_TYPE,
        "$.type",
    ),
]


async def test_each_bad_input_gets_an_error_event_and_a_dead_letter(nats_url: str) -> None:
    async with client(nats_url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        async with TaskService(runtime(nats_url)) as service:
            for name, data, _, _ in BAD_INPUTS:
                await js.publish(TASK_SUBJECT, data, headers={h.TRACE_ID: f"trace-{name}"})
            count = len(BAD_INPUTS)
            dead = await wait_entries(js, streams.DEAD_LETTERS.name, count, subject=DLQ_SUBJECT)
            events = await wait_entries(js, streams.ERRORS.name, count, subject=EVENTS_SUBJECT)
            assert len(dead) == len(events) == count

            dead_by_trace = {(e.headers or {})[h.TRACE_ID]: e for e in dead}
            events_by_trace = {
                event.trace_id: event
                for event in (Codec(ErrorEvent).decode(e.data) for e in events)
            }
            for name, data, code, field in BAD_INPUTS:
                event = events_by_trace[f"trace-{name}"]
                assert event.code is code, (name, event)
                assert event.original == data, name
                assert event.original_size == len(data) and not event.truncated
                assert event.subject == TASK_SUBJECT
                assert event.service == SERVICE_NAME
                assert event.message
                letter = dead_by_trace[f"trace-{name}"]
                assert letter.data == data, name
                hdrs = letter.headers or {}
                assert hdrs[h.DLQ_CODE] == code.value, name
                assert hdrs[h.DLQ_DELIVERIES] == "1"
                assert h.DLQ_TRUNCATED not in hdrs
                if field is not None:
                    assert event.field == field, (name, event)
                    assert hdrs[h.DLQ_FIELD] == field, name

            # Nothing bad reached the handler; nothing is left to redeliver; the service runs on.
            assert service.seen == []
            await wait_count(js, TASK_STREAM, 0)
            assert service.state is ServiceState.RUNNING and not service.crashed.is_set()
            await publish_tasks(js, ["good"])
            await service.wait_for(lambda: service.handled == ["tgood"])
            codes = Counter(code.value for _, _, code, _ in BAD_INPUTS)
            for code, n in codes.items():
                assert counter(service, "bad_input", source=TASK_STREAM, code=code) == n, code


@pytest.fixture
async def small_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    """A nats-server whose max_payload is small enough to hit in a test."""
    server = NatsServer(
        NatsServerSettings(
            store_dir=tmp_path / "small", port=RANDOM_PORT, max_payload=SMALL_MAX_PAYLOAD
        )
    )
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def test_oversized_publish_is_refused_before_the_server(small_server: NatsServer) -> None:
    big = make_task("big")
    big.metadata["blob"] = "x" * SMALL_MAX_PAYLOAD
    data = TASKS.encode(big)
    with pytest.raises(PayloadTooLarge) as refused:
        check_size(data, None, SMALL_MAX_PAYLOAD)
    assert refused.value.code is ErrorCode.TOO_LARGE
    assert refused.value.limit == SMALL_MAX_PAYLOAD and refused.value.size == len(data)
    # Headers count too: a payload that fits alone may not fit with them.
    fits = b"x" * (SMALL_MAX_PAYLOAD - 8)
    check_size(fits, None, SMALL_MAX_PAYLOAD)
    with pytest.raises(PayloadTooLarge):
        check_size(fits, {h.TRACE_ID: "t" * 32}, SMALL_MAX_PAYLOAD)

    async with asyncio.timeout(10):
        bus = await Bus.connect(
            ConnectOptions(url=small_server.url, name="oversize", retry_forever=False)
        )
        try:
            assert bus.max_payload == SMALL_MAX_PAYLOAD
            await declare(bus.js)
            with pytest.raises(PayloadTooLarge):
                await bus.publish(TASK_SUBJECT, big, msg_id="big")
            with pytest.raises(PayloadTooLarge):
                await bus.publish_raw(TASK_SUBJECT, data, {})
            with pytest.raises(PayloadTooLarge):
                await bus.emit(subjects.heartbeat("x"), big)
            # The connection was never put at risk: it still publishes.
            assert bus.nc.is_connected
            ack = await bus.publish(TASK_SUBJECT, make_task("small"), msg_id="small")
            assert ack.stream == TASK_STREAM and not ack.duplicate
            assert bus.nc.is_connected
        finally:
            await bus.close()


async def test_size_check_matches_what_the_server_counts(small_server: NatsServer) -> None:
    """Exactly max_payload bytes of headers plus payload pass; one byte more is refused locally.

    If ``headers_size`` undercounted, the server would close the connection instead.
    """
    hdrs = {h.MSG_ID: "edge", h.TRACE_ID: "trace-edge"}
    room = SMALL_MAX_PAYLOAD - headers_size(hdrs)
    async with asyncio.timeout(10):
        bus = await Bus.connect(
            ConnectOptions(url=small_server.url, name="edge", retry_forever=False)
        )
        try:
            await declare(bus.js)
            with pytest.raises(PayloadTooLarge):
                await bus.publish_raw(TASK_SUBJECT, b"x" * (room + 1), hdrs)
            ack = await bus.publish_raw(TASK_SUBJECT, b"x" * room, hdrs)
            assert ack.seq == 1 and not ack.duplicate
            await bus.flush()
            assert bus.nc.is_connected
            stored = await bus.js.get_msg(TASK_STREAM, 1)
            assert stored.data == b"x" * room
        finally:
            await bus.close()


async def test_bad_input_at_the_size_limit_is_dead_lettered_truncated(
    small_server: NatsServer,
) -> None:
    """A dead letter adds headers to input already at the limit: it keeps what fits, and says so."""
    url = small_server.url
    async with client(url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        async with TaskService(runtime(url)) as service:
            data = b"\xc1" + b"z" * (SMALL_MAX_PAYLOAD - 200)
            await js.publish(TASK_SUBJECT, data)
            [letter] = await wait_entries(js, streams.DEAD_LETTERS.name, 1, subject=DLQ_SUBJECT)
            hdrs = letter.headers or {}
            assert hdrs[h.DLQ_CODE] == ErrorCode.NOT_MSGPACK.value
            assert hdrs[h.DLQ_TRUNCATED] == str(len(data))
            assert data.startswith(letter.data) and 0 < len(letter.data) < len(data)
            [entry] = await wait_entries(js, streams.ERRORS.name, 1, subject=EVENTS_SUBJECT)
            event = Codec(ErrorEvent).decode(entry.data)
            assert event.code is ErrorCode.NOT_MSGPACK
            assert event.original_size == len(data)
            assert event.truncated and data.startswith(event.original)
            await wait_count(js, TASK_STREAM, 0)
            await publish_tasks(js, ["after"])
            await service.wait_for(lambda: service.handled == ["tafter"])
            assert not service.crashed.is_set()
