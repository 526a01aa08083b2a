"""The sandbox client's own reading of replies (real nats-server; the sandbox service is
stood in for by a subscription that answers with chosen bytes, so that each refusal is
sent exactly; the real service is behind the generator's and the validator's tests)."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.msg import Msg

from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, SandboxSession, SandboxSnapshot
from services.runtime.ask import Refused
from services.runtime.bus import Bus
from services.sandbox.client import SandboxClient, WorkspaceRefused
from tests.integration.support import client

SESSION = SandboxSession(session="s1", subject="temper.v1.test.sandbox.instance")


async def snapshot_answered_with(url: str, answer: bytes) -> SandboxSnapshot:
    async def on_request(msg: Msg) -> None:
        await msg.respond(answer)

    async with asyncio.timeout(10), client(url) as service, client(url) as nc:
        await service.subscribe(SESSION.subject, cb=on_request)
        await Bus(service).flush()  # the server knows the subscription (see Bus.flush)
        return await SandboxClient(nc, 2.0).snapshot(SESSION)


async def test_a_snapshot_is_returned(nats_url: str) -> None:
    saved = SandboxSnapshot(snapshot="snap-1", session="s1", size=10)
    assert await snapshot_answered_with(nats_url, encode(saved)) == saved


async def test_a_snapshot_refused_as_a_bad_request_is_the_workspace_s_doing(
    nats_url: str,
) -> None:
    refusal = ErrorReply(code=ErrorCode.BAD_REQUEST, message="archive over 40 MiB")
    with pytest.raises(WorkspaceRefused) as raised:
        await snapshot_answered_with(nats_url, encode(refusal))
    assert raised.value.message == "archive over 40 MiB"


async def test_any_other_refusal_of_a_snapshot_stays_a_plain_refusal(nats_url: str) -> None:
    refusal = ErrorReply(code=ErrorCode.UNAVAILABLE, message="snapshot store is down")
    with pytest.raises(Refused) as raised:
        await snapshot_answered_with(nats_url, encode(refusal))
    assert not isinstance(raised.value, WorkspaceRefused)
    assert raised.value.code is ErrorCode.UNAVAILABLE
