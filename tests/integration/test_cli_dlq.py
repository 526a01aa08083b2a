"""``temper dlq list|show|retry`` on dead letters produced by the real runtime."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from nats.js import JetStreamContext, api

from protocol import headers as h
from protocol import streams, subjects
from protocol.errors import ErrorCode
from protocol.messages import Task
from services.runtime import Delivery, Reject
from services.runtime.jetstream import ensure_streams
from tests.integration.support import (
    TASK_STREAM,
    TASK_SUBJECT,
    TASKS,
    TaskService,
    client,
    make_task,
    runtime,
    stream_entries,
    wait_entries,
)
from tests.integration.test_cli_harness import temper

DLQ = streams.DEAD_LETTERS.name
GARBAGE = b"\xc1\x00 definitely not msgpack \xff"


class Gate:
    """The handler: rejects the task ids in ``refuse``; everything else is handled."""

    def __init__(self, *refuse: str) -> None:
        self.refuse = set(refuse)

    async def __call__(self, task: Task, delivery: Delivery) -> None:
        if task.id in self.refuse:
            raise Reject(ErrorCode.BAD_REQUEST, f"no thanks: {task.id}", field="$.id")


@dataclass
class Stack:
    url: str
    js: JetStreamContext
    service: TaskService
    gate: Gate


@pytest.fixture
async def stack(nats_url: str) -> AsyncIterator[Stack]:
    gate = Gate("t-rej1", "t-rej2")
    async with client(nats_url) as nc, TaskService(runtime(nats_url), gate) as service:
        yield Stack(nats_url, nc.jetstream(), service, gate)


def rejected_task(name: str) -> bytes:
    return TASKS.encode(make_task(name.removeprefix("t")))  # make_task prefixes "t"


async def dead_letters(js: JetStreamContext) -> list[api.RawStreamMsg]:
    """Garbage and two tasks the service rejects -> three dead letters, oldest first."""
    await js.publish(TASK_SUBJECT, GARBAGE, headers={h.TRACE_ID: "trace-garbage"})
    for task_id in ("t-rej1", "t-rej2"):
        await js.publish(
            TASK_SUBJECT,
            rejected_task(task_id),
            headers={h.TRACE_ID: f"trace-{task_id}", h.MSG_ID: task_id},
        )
    return await wait_entries(js, DLQ, 3)


def by_code(entries: list[api.RawStreamMsg]) -> dict[str, list[api.RawStreamMsg]]:
    out: dict[str, list[api.RawStreamMsg]] = {}
    for entry in entries:
        out.setdefault((entry.headers or {})[h.DLQ_CODE], []).append(entry)
    return out


async def test_list_shows_code_and_source(stack: Stack) -> None:
    entries = await dead_letters(stack.js)
    done = await temper(stack.url, "dlq", "list")
    assert done.code == 0, done.err
    header, *rows = done.out.splitlines()
    assert header.split()[:5] == ["SEQ", "WHEN", "SOURCE", "CODE", "SIZE"]
    assert len(rows) == 3
    for row, entry in zip(rows, entries, strict=True):
        fields = row.split()
        assert int(fields[0]) == entry.seq
        assert fields[3] == TASK_STREAM
        assert fields[4] == (entry.headers or {})[h.DLQ_CODE]
        assert fields[5] == f"{len(entry.data or b'')}B"
    assert sorted(row.split()[4] for row in rows) == ["bad_request", "bad_request", "not_msgpack"]
    assert any("no thanks: t-rej1" in row for row in rows)

    limited = await temper(stack.url, "dlq", "list", "--limit", "1")
    assert len(limited.out.splitlines()) == 2
    other = await temper(stack.url, "dlq", "list", "--source", "TEMPER_ROLLOUTS")
    assert other.code == 0
    assert other.out.splitlines()[-1] == "no dead letters"


async def test_show_prints_headers_and_the_decode_error_or_the_message(stack: Stack) -> None:
    codes = by_code(await dead_letters(stack.js))
    [garbage] = codes["not_msgpack"]
    done = await temper(stack.url, "dlq", "show", str(garbage.seq))
    assert done.code == 0, done.err
    shown = json.loads(done.out)
    assert shown["seq"] == garbage.seq
    assert shown["subject"] == subjects.dead_letter(TASK_STREAM)
    assert shown["size"] == len(GARBAGE)
    assert shown["headers"][h.DLQ_SUBJECT] == TASK_SUBJECT
    assert shown["headers"][h.DLQ_SOURCE] == TASK_STREAM
    assert shown["headers"][h.DLQ_CODE] == "not_msgpack"
    assert shown["headers"][h.TRACE_ID] == "trace-garbage"
    assert shown["undecodable"]["code"] == "not_msgpack"
    assert shown["undecodable"]["message"]
    assert bytes.fromhex(shown["original_hex"]) == GARBAGE
    assert "message" not in shown

    rejected = codes["bad_request"][0]
    done = await temper(stack.url, "dlq", "show", str(rejected.seq))
    assert done.code == 0, done.err
    shown = json.loads(done.out)
    assert shown["headers"][h.DLQ_REASON].startswith("no thanks: t-rej")
    assert shown["headers"][h.DLQ_FIELD] == "$.id"
    assert shown["message"]["type"] == "task"
    assert shown["message"]["id"] in ("t-rej1", "t-rej2")
    assert "undecodable" not in shown


@pytest.mark.parametrize("seq", ["999", "0"])
async def test_show_a_missing_entry_exits_2(stack: Stack, seq: str) -> None:
    await dead_letters(stack.js)
    done = await temper(stack.url, "dlq", "show", seq)
    assert done.code == 2
    assert f"no dead letter #{seq}" in done.err
    assert "Traceback" not in done.err


async def test_retry_republishes_the_original_and_deletes_the_entry(stack: Stack) -> None:
    entries = await dead_letters(stack.js)
    rejected = next(e for e in entries if e.data == rejected_task("t-rej1"))
    stack.gate.refuse.clear()  # the service now accepts what it rejected

    done = await temper(stack.url, "dlq", "retry", str(rejected.seq))
    assert done.code == 0, done.err
    assert "retried 1 dead letter(s)" in done.out
    await stack.service.wait_for(lambda: "t-rej1" in stack.service.handled)
    # It came back on its original subject with its trace id (and was consumed: not dead again).
    retried = [s for s in stack.service.seen if s.id == "t-rej1"]
    assert len(retried) == 2
    remaining = await stream_entries(stack.js, DLQ)
    assert rejected.seq not in [e.seq for e in remaining]
    assert len(remaining) == 2
    missing = await temper(stack.url, "dlq", "show", str(rejected.seq))
    assert missing.code == 2


async def test_retry_keeps_the_original_headers(nats_url: str) -> None:
    # No consumer this time: the retried message stays in the task stream to be inspected.
    async with client(nats_url) as nc:
        js = nc.jetstream()
        async with TaskService(runtime(nats_url), Gate("t-rej1", "t-rej2")):
            await dead_letters(js)
        [garbage] = by_code(await stream_entries(js, DLQ))["not_msgpack"]
        done = await temper(nats_url, "dlq", "retry", str(garbage.seq))
        assert done.code == 0, done.err
        [back] = await stream_entries(js, TASK_STREAM)
        assert (back.subject, back.data) == (TASK_SUBJECT, GARBAGE)
        hdrs = back.headers or {}
        assert hdrs[h.TRACE_ID] == "trace-garbage"
        assert hdrs[h.MSG_ID].startswith(f"retry:{garbage.seq}:")
        assert not any(key.startswith("Temper-Dlq-") for key in hdrs)


async def test_retry_all(stack: Stack) -> None:
    entries = await dead_letters(stack.js)
    [garbage] = by_code(entries)["not_msgpack"]
    stack.gate.refuse.clear()

    done = await temper(stack.url, "dlq", "retry", "--all")
    assert done.code == 0, done.err
    assert "retried 3 dead letter(s)" in done.out
    await stack.service.wait_for(lambda: {"t-rej1", "t-rej2"} <= set(stack.service.handled))
    # The garbage went back too: rejected again, it is a new dead letter with the same bytes.
    async with asyncio.timeout(5):
        while True:
            now = await stream_entries(stack.js, DLQ)
            if now and all(e.seq > max(x.seq for x in entries) for e in now):
                break
            await asyncio.sleep(0.05)
    [again] = now
    assert again.data == GARBAGE
    assert (again.headers or {})[h.DLQ_CODE] == "not_msgpack"
    assert again.seq != garbage.seq


async def test_retry_all_by_source_and_an_empty_queue(stack: Stack) -> None:
    empty = await temper(stack.url, "dlq", "list")
    assert (empty.code, empty.out.splitlines()[-1]) == (0, "no dead letters")
    nothing = await temper(stack.url, "dlq", "retry", "--all")
    assert (nothing.code, nothing.out.strip()) == (0, "retried 0 dead letter(s)")

    await dead_letters(stack.js)
    other = await temper(stack.url, "dlq", "retry", "--all", "--source", "TEMPER_ROLLOUTS")
    assert (other.code, other.out.strip()) == (0, "retried 0 dead letter(s)")
    assert len(await stream_entries(stack.js, DLQ)) == 3


async def test_a_dead_letter_without_a_stream_to_return_to_is_left_in_place(
    nats_url: str,
) -> None:
    async with client(nats_url) as nc:
        js = nc.jetstream()
        await ensure_streams(js, (streams.DEAD_LETTERS, streams.BY_NAME[TASK_STREAM]))
        # A rejected request: its subject has no stream (the runtime dead-letters those too).
        await js.publish(
            subjects.dead_letter("control"),
            b"\xc1",
            headers={
                h.DLQ_SUBJECT: subjects.status(),
                h.DLQ_SOURCE: "control",
                h.DLQ_CODE: "not_msgpack",
            },
        )
        await js.publish(
            subjects.dead_letter(TASK_STREAM),
            GARBAGE,
            headers={
                h.DLQ_SUBJECT: TASK_SUBJECT,
                h.DLQ_SOURCE: TASK_STREAM,
                h.DLQ_CODE: "not_msgpack",
            },
        )
        done = await temper(nats_url, "dlq", "retry", "--all")
        assert done.code == 1
        assert "no stream captures temper.v1.control.status" in done.err
        assert "Traceback" not in done.err
        assert "retried 1 dead letter(s), 1 left in place" in done.out
        [left] = await stream_entries(js, DLQ)
        assert left.subject == subjects.dead_letter("control")
        [back] = await stream_entries(js, TASK_STREAM)
        assert back.data == GARBAGE
