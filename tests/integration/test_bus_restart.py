"""The client rides through a nats-server crash and restart (same port, same store).

Each test kills its own server with SIGKILL and starts it again on the port it had;
the streams come back from the store.  What the client must do: carry on where it
was, or give up with one clear error once the server stays away for its bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from protocol import streams, subjects
from protocol.client import StackUnavailable, TemperClient
from protocol.codec import encode
from protocol.messages import ChatMessage, Rollout, ScoredRollout, Task
from services.runtime.jetstream import ensure_streams
from services.runtime.natsserver import NatsServer
from tests.integration.support import client, stream_entries

#: Short, so a test of giving up takes about a second.
BOUND_S = 1.0
TASK = Task(id="br-1", domain="math", prompt=[ChatMessage(role="user", content="x")], n=3)


def scored(index: int) -> ScoredRollout:
    rollout = Rollout(id=f"{TASK.id}-r{index}", task=TASK, sample_index=index)
    return ScoredRollout(id=f"{TASK.id}-s{index}", rollout=rollout, reward=1.0)


async def publish_scored(js: JetStreamContext, index: int) -> None:
    await js.publish(subjects.scored(TASK.domain, TASK.id), encode(scored(index)))


@pytest.fixture
async def js(nats_url: str) -> AsyncIterator[JetStreamContext]:
    """The test's own connection (it reconnects for ever), with every stream declared."""
    async with client(nats_url) as nc:
        await ensure_streams(nc.jetstream(), streams.ALL)
        yield nc.jetstream()


async def restart(server: NatsServer, down_s: float = 0.5) -> None:
    """Crash the server, leave it down for ``down_s``, start it again where it was."""
    url = server.url
    server.kill()
    await asyncio.sleep(down_s)
    await server.start_async()
    assert server.url == url


async def test_scored_carries_on_after_the_last_result_it_yielded(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    await publish_scored(js, 0)
    async with (
        await TemperClient.connect(nats_server.url, reconnect_s=10) as temper,
        contextlib.aclosing(temper.scored(TASK.id, timeout_s=20)) as results,
    ):
        assert (await anext(results)).id == "br-1-s0"
        await restart(nats_server)
        await publish_scored(js, 1)
        await publish_scored(js, 2)
        # Neither the one yielded before the crash again, nor a gap.
        assert [(await anext(results)).id for _ in range(2)] == ["br-1-s1", "br-1-s2"]


async def test_wait_scored_started_before_a_crash_completes_after_it(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    async with await TemperClient.connect(nats_server.url, reconnect_s=10) as temper:
        waiting = asyncio.create_task(temper.wait_scored(TASK.id, count=2, timeout_s=20))
        try:
            await publish_scored(js, 0)
            await asyncio.sleep(0.3)  # the waiter has it before the crash
            await restart(nats_server, down_s=1.0)
            assert not waiting.done()
            await publish_scored(js, 1)
            results = await asyncio.wait_for(waiting, 15)
        finally:
            waiting.cancel()
    assert sorted(r.id for r in results) == ["br-1-s0", "br-1-s1"]


async def test_a_submit_while_the_server_is_down_lands_once_it_is_back(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    async with await TemperClient.connect(nats_server.url, reconnect_s=10) as temper:
        nats_server.kill()
        submitting = asyncio.create_task(temper.submit(TASK, timeout_s=1.0))
        try:
            await asyncio.sleep(1.5)  # longer than one publish's timeout
            assert not submitting.done()
            await nats_server.start_async()
            receipt = await asyncio.wait_for(submitting, 15)
        finally:
            submitting.cancel()
    assert receipt.task_id == TASK.id
    stored = await stream_entries(js, streams.task_stream_name(TASK.tier))
    assert len(stored) == 1


async def next_published(
    nc: NATS, subject: str, messages: AsyncIterator[Msg], timeout_s: float = 15.0
) -> Msg:
    """Publish on ``subject`` until ``messages`` yields one.

    Until the server knows the subscription (again, after a restart) a publish reaches nobody.
    """
    pending = asyncio.ensure_future(anext(messages))
    try:
        async with asyncio.timeout(timeout_s):
            while not pending.done():
                await nc.publish(subject, b"ping")
                await asyncio.wait([pending], timeout=0.05)
        return pending.result()
    finally:
        pending.cancel()


async def test_messages_keep_coming_after_a_restart(nats_server: NatsServer) -> None:
    subject = subjects.heartbeat("br")
    async with (
        client(nats_server.url) as nc,
        await TemperClient.connect(nats_server.url, reconnect_s=10) as temper,
        contextlib.aclosing(temper.messages(subject)) as messages,
    ):
        assert (await next_published(nc, subject, messages)).subject == subject
        await restart(nats_server)
        assert (await next_published(nc, subject, messages)).subject == subject


@pytest.mark.parametrize("moment", ["waiting", "connecting the consumer", "publishing"])
async def test_giving_up_once_the_server_stays_away(
    nats_server: NatsServer, js: JetStreamContext, moment: str
) -> None:
    async with await TemperClient.connect(nats_server.url, reconnect_s=BOUND_S) as temper:
        call: Coroutine[Any, Any, object] = (
            temper.submit(TASK, timeout_s=10)
            if moment == "publishing"
            else temper.wait_scored(TASK.id, count=1, timeout_s=30)
        )
        if moment == "waiting":
            work = asyncio.create_task(call)
            await asyncio.sleep(0.3)  # following the stream before the crash
            nats_server.kill()
        else:
            nats_server.kill()
            work = asyncio.create_task(call)
        started = time.monotonic()
        with pytest.raises(StackUnavailable) as raised:
            await asyncio.wait_for(work, 10)
        took = time.monotonic() - started
    assert str(raised.value) == (
        f"NATS at {nats_server.url} unreachable for 1s; start the stack (`temper up`)"
    )
    assert BOUND_S <= took < BOUND_S + 1.5
