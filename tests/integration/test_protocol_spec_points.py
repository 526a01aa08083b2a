"""Points of docs/protocol.md that a running stack shows: a reply carries the request's
headers back (§7), and a resubmitted task is stored again only with a new ``attempt``
(§7), against a real nats-server, real streams and the real control service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.aio.client import Client as NATS

from protocol import ANY, headers, streams, subjects
from protocol.client import TemperClient, task_msg_id
from protocol.codec import encode
from protocol.messages import ChatMessage, ErrorReply, StackStatus, StatusRequest, Task
from services.control import ControlService, ControlSettings
from services.runtime.jetstream import ensure_streams
from tests.integration.support import client, runtime
from tests.unit.test_protocol_docs import DOC

pytestmark = pytest.mark.integration

SENT = {headers.TRACE_ID: "4bf92f3577b34da6a3ce929d0e0e4736", "X-Caller": "spec-test"}


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    async with client(nats_url) as conn:
        yield conn


async def test_a_reply_carries_the_requests_headers_back(nats_url: str, nc: NATS) -> None:
    assert "A reply carries the request's headers back, unchanged" in DOC
    settings = ControlSettings(runtime=runtime(nats_url, instance="ctl"))
    async with asyncio.timeout(20), ControlService(settings):
        good = await nc.request(subjects.status(), encode(StatusRequest()), 5, headers=SENT)
        bad = await nc.request(subjects.status(), b"\xc1", 5, headers=SENT)
        plain = await nc.request(subjects.status(), encode(StatusRequest()), 5)
    assert isinstance(ANY.decode(good.data), StackStatus)
    assert isinstance(ANY.decode(bad.data), ErrorReply)
    assert dict(good.headers or {}) == SENT
    assert dict(bad.headers or {}) == SENT
    assert not plain.headers  # nothing of the reply's own


async def test_a_task_is_stored_again_only_with_a_new_attempt(nats_url: str, nc: NATS) -> None:
    await ensure_streams(nc.jetstream(), streams.TASK_STREAMS)
    first = Task(id="again", domain="math", prompt=[ChatMessage(role="user", content="2+2")])
    retry = msgspec.structs.replace(first, attempt=1)
    async with await TemperClient.connect(nats_url) as temper:
        stored = await temper.submit(first)
        repeated = await temper.submit(first)
        again = await temper.submit(retry)
    assert not stored.duplicate
    assert repeated.duplicate and repeated.seq == stored.seq
    assert not again.duplicate and again.seq == stored.seq + 1
    message = await nc.jetstream().get_msg(again.stream, again.seq)
    assert message.headers is not None
    assert message.headers[headers.MSG_ID] == task_msg_id(retry) == "task:again:1"
