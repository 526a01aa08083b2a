"""``temper tail``: decoded messages as JSON lines, packed arrays as numbers unless ``--raw``."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
from typing import Any

from nats.aio.client import Client as NATS

from protocol import headers as h
from protocol import subjects
from protocol.codec import encode
from protocol.messages import ChatMessage, Rollout, Task
from protocol.packed import pack_f32, pack_i32, pack_u8
from services.runtime.natsserver import NatsServer
from tests.integration.support import client
from tests.integration.test_cli_harness import finish, start

TOKENS = [5, 6, 7, 8]
LOGPROBS = [-0.5, -0.25]
GARBAGE = b"\xc1 not msgpack"


def rollout() -> Rollout:
    task = Task(id="tail-1", domain="math", prompt=[ChatMessage(role="user", content="x")])
    return Rollout(
        id="tail-1/0",
        task=task,
        sample_index=0,
        tokens=pack_i32(TOKENS),
        prompt_len=2,
        logprobs=pack_f32(LOGPROBS),
        loss_mask=pack_u8([1, 0]),
    )


async def tail_while_publishing(
    url: str, nc: NATS, argv: list[str], messages: list[tuple[str, bytes]]
) -> list[dict[str, Any]]:
    """Run ``temper tail ARGV`` and publish ``messages`` over and over until it exits.

    Until tail has subscribed nothing reaches it, so one round might be missed.
    """
    proc = await start(url, "tail", *argv)
    ended = asyncio.ensure_future(proc.wait())
    try:
        async with asyncio.timeout(20):
            while not ended.done():
                for subject, data in messages:
                    await nc.publish(subject, data, headers={h.TRACE_ID: "trace-tail"})
                await nc.flush()
                await asyncio.wait([ended], timeout=0.05)
    finally:
        done = await finish(proc)
    assert done.code == 0, done.err
    return [json.loads(line) for line in done.out.splitlines()]


async def test_tail_decodes_messages_and_reports_garbage(nats_url: str) -> None:
    subject = subjects.rollout("math")
    async with client(nats_url) as nc:
        records = await tail_while_publishing(
            nats_url,
            nc,
            ["temper.v1.>", "--count", "4"],
            [(subject, encode(rollout())), (subjects.rollout("junk"), GARBAGE)],
        )
    assert len(records) == 4
    good = [r for r in records if r["subject"] == subject]
    bad = [r for r in records if r["subject"] == subjects.rollout("junk")]
    assert len(good) == len(bad) == 2
    for record in good:
        assert record["trace_id"] == "trace-tail"
        message = record["message"]
        assert (message["type"], message["id"]) == ("rollout", "tail-1/0")
        assert message["tokens"] == TOKENS
        assert message["logprobs"] == LOGPROBS
        assert message["loss_mask"] == [1, 0]
        assert message["task"]["prompt"] == [{"role": "user", "content": "x", "name": None}]
    for record in bad:
        assert record["size"] == len(GARBAGE)
        assert record["error"]["code"] == "not_msgpack"
        assert "message" not in record


async def test_tail_raw_keeps_packed_arrays_as_base64(nats_url: str) -> None:
    subject = subjects.rollout("math")
    async with client(nats_url) as nc:
        [record] = await tail_while_publishing(
            nats_url, nc, [subject, "--count", "1", "--raw"], [(subject, encode(rollout()))]
        )
    assert record["message"]["tokens"] == base64.b64encode(pack_i32(TOKENS)).decode()
    assert record["message"]["id"] == "tail-1/0"


async def printed_with_trace(
    proc: asyncio.subprocess.Process, nc: NATS, subject: str, trace: str
) -> dict[str, Any]:
    """Publish a rollout carrying ``trace`` until tail prints it (it may print it more than once).

    Until tail's subscription is known to the server (again, after a restart) nobody gets it.
    """
    assert proc.stdout is not None
    stdout = proc.stdout

    async def read() -> dict[str, Any]:
        while True:
            line = await stdout.readline()
            assert line, "tail ended"
            record: dict[str, Any] = json.loads(line)
            if record["trace_id"] == trace:
                return record

    reader = asyncio.ensure_future(read())
    try:
        async with asyncio.timeout(20):
            while not reader.done():
                await nc.publish(subject, encode(rollout()), headers={h.TRACE_ID: trace})
                await asyncio.wait([reader], timeout=0.05)
        return reader.result()
    finally:
        reader.cancel()


async def test_tail_keeps_printing_after_a_nats_server_restart(nats_server: NatsServer) -> None:
    url = nats_server.url
    subject = subjects.rollout("math")
    proc = await start(url, "tail", subject, "--reconnect-timeout", "15")
    try:
        async with client(url) as nc:
            before = await printed_with_trace(proc, nc, subject, "before")
            nats_server.kill()
            await asyncio.sleep(1.0)
            await nats_server.start_async()
            after = await printed_with_trace(proc, nc, subject, "after")
        proc.send_signal(signal.SIGINT)
    finally:
        done = await finish(proc)
    assert done.code == 0, done.err
    assert done.err == ""
    for record in (before, after):
        assert (record["message"]["type"], record["message"]["id"]) == ("rollout", "tail-1/0")
