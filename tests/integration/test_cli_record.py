"""``temper record`` on one server, ``temper replay`` into another: same bytes, ids, redirects."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from protocol import headers as h
from protocol import streams, subjects
from services.runtime.jetstream import ensure_streams
from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from tests.integration.support import (
    TASK_STREAM,
    TASK_SUBJECT,
    TASKS,
    client,
    make_task,
    stream_entries,
)
from tests.integration.test_cli_harness import start, temper

COUNT = 3


@dataclass(frozen=True)
class Recording:
    path: Path
    #: What the file holds, in order: (Nats-Msg-Id, payload).
    messages: list[tuple[str, bytes]]


@pytest.fixture
def server_b(tmp_path: Path) -> Iterator[NatsServer]:
    """A second, fresh nats-server: where the recording is replayed."""
    server = NatsServer(NatsServerSettings(store_dir=tmp_path / "b", port=RANDOM_PORT))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def js_a(nats_url: str) -> AsyncIterator[JetStreamContext]:
    async with client(nats_url) as nc:
        await ensure_streams(nc.jetstream(), streams.ALL)
        yield nc.jetstream()


@pytest.fixture
async def js_b(server_b: NatsServer) -> AsyncIterator[JetStreamContext]:
    async with client(server_b.url) as nc:
        await ensure_streams(nc.jetstream(), streams.ALL)
        yield nc.jetstream()


@pytest.fixture
async def recording(nats_url: str, js_a: JetStreamContext, tmp_path: Path) -> Recording:
    """``temper record 'temper.v1.task.>' FILE --count 3`` while tasks are being published."""
    path = tmp_path / "tasks.jsonl"
    proc = await start(nats_url, "record", "temper.v1.task.>", str(path), "--count", str(COUNT))
    ended = asyncio.ensure_future(proc.wait())
    published: list[tuple[str, bytes]] = []
    try:
        async with asyncio.timeout(20):
            # Until record has subscribed nothing is recorded: publish until it has seen enough.
            while not ended.done():
                task = make_task(f"rec{len(published)}")
                payload = TASKS.encode(task)
                trace = f"trace-{task.id}"
                await js_a.publish(
                    TASK_SUBJECT, payload, headers={h.MSG_ID: task.id, h.TRACE_ID: trace}
                )
                published.append((task.id, payload))
                await asyncio.wait([ended], timeout=0.05)
    finally:
        if not ended.done():
            proc.kill()
        await ended
    assert proc.returncode == 0
    assert proc.stderr is not None
    assert f"recorded {COUNT} messages to {path}" in (await proc.stderr.read()).decode()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == COUNT
    messages = [(line["headers"][h.MSG_ID], base64.b64decode(line["data"])) for line in lines]
    # A run of consecutive published messages, unchanged.
    start_at = published.index(messages[0])
    assert messages == published[start_at : start_at + COUNT]
    for line, (msg_id, _) in zip(lines, messages, strict=True):
        assert line["subject"] == TASK_SUBJECT
        assert line["headers"][h.TRACE_ID] == f"trace-{msg_id}"
        assert isinstance(line["received_at"], float)
    return Recording(path, messages)


async def test_replay_stores_the_same_bytes_without_message_ids(
    server_b: NatsServer, js_b: JetStreamContext, recording: Recording
) -> None:
    done = await temper(server_b.url, "replay", str(recording.path))
    assert done.code == 0, done.err
    assert f"replayed {COUNT} messages ({COUNT} into streams, 0 as plain NATS)" in done.err

    stored = await stream_entries(js_b, TASK_STREAM)
    assert [entry.data for entry in stored] == [data for _, data in recording.messages]
    for entry, (msg_id, _) in zip(stored, recording.messages, strict=True):
        assert entry.subject == TASK_SUBJECT
        assert h.MSG_ID not in (entry.headers or {})
        assert (entry.headers or {})[h.TRACE_ID] == f"trace-{msg_id}"

    # Without ids nothing is deduplicated: a second replay stores everything again.
    again = await temper(server_b.url, "replay", str(recording.path))
    assert again.code == 0, again.err
    assert len(await stream_entries(js_b, TASK_STREAM)) == 2 * COUNT


async def test_replay_keep_ids_is_deduplicated(
    server_b: NatsServer, js_b: JetStreamContext, recording: Recording
) -> None:
    for _ in range(2):
        done = await temper(server_b.url, "replay", str(recording.path), "--keep-ids")
        assert done.code == 0, done.err
    stored = await stream_entries(js_b, TASK_STREAM)
    assert [(e.headers or {}).get(h.MSG_ID) for e in stored] == [i for i, _ in recording.messages]
    assert [entry.data for entry in stored] == [data for _, data in recording.messages]


async def test_replay_subject_redirects(
    server_b: NatsServer, js_b: JetStreamContext, recording: Recording
) -> None:
    target = subjects.task(0, "elsewhere")
    done = await temper(server_b.url, "replay", str(recording.path), "--subject", target)
    assert done.code == 0, done.err
    assert await stream_entries(js_b, TASK_STREAM) == []
    stored = await stream_entries(js_b, streams.task_stream_name(0))
    assert [(e.subject, e.data) for e in stored] == [(target, d) for _, d in recording.messages]


async def test_replay_to_a_subject_without_a_stream_publishes_plain_nats(
    server_b: NatsServer, recording: Recording
) -> None:
    async with client(server_b.url) as nc:
        sub = await nc.subscribe("debug.replayed")
        await nc.flush()
        done = await temper(
            server_b.url, "replay", str(recording.path), "--subject", "debug.replayed"
        )
        assert done.code == 0, done.err
        assert f"({0} into streams, {COUNT} as plain NATS)" in done.err
        got = [(await sub.next_msg(timeout=5)).data for _ in range(COUNT)]
    assert got == [data for _, data in recording.messages]


async def test_record_duration_with_no_traffic(nats_url: str, tmp_path: Path) -> None:
    path = tmp_path / "quiet.jsonl"
    done = await temper(nats_url, "record", "temper.v1.>", str(path), "--duration", "0.3")
    assert done.code == 0, done.err
    assert "recorded 0 messages" in done.err
    assert path.read_text() == ""
