"""``temper tail``: decoded messages as JSON lines, packed arrays as numbers unless ``--raw``."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from nats.aio.client import Client as NATS

from protocol import headers as h
from protocol import subjects
from protocol.codec import encode
from protocol.messages import ChatMessage, Rollout, Task
from protocol.packed import pack_f32, pack_i32, pack_u8
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
