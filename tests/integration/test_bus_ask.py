"""Typed request/reply (``services.runtime.ask``) against a real nats-server.

The responder is a plain NATS subscription that answers with chosen bytes, so each way a
reply can go wrong is sent exactly as a service (or a broken one) would send it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgpack
import pytest
import structlog
from nats.aio.msg import Msg

from protocol import headers as h
from protocol.codec import Codec, encode
from protocol.errors import ErrorCode, PayloadTooLarge
from protocol.messages import (
    CommitReply,
    ErrorReply,
    Heartbeat,
    SandboxExec,
    SandboxResult,
    SandboxStatus,
    ServiceState,
)
from services.runtime.ask import (
    AskError,
    AskTimeout,
    BadReply,
    NoResponder,
    Refused,
    Unsent,
    ask,
)
from services.runtime.bus import Bus, ConnectOptions
from tests.integration.support import client

SUBJECT = "temper.v1.test.ask"
REQUEST = SandboxExec(id="q1", code="print(1)")
RESULT = SandboxResult(id="q1", status=SandboxStatus.OK, exit_code=0, stdout="1\n")


@contextlib.asynccontextmanager
async def responder(url: str, answer: bytes | None) -> AsyncIterator[list[Msg]]:
    """Answers every request on SUBJECT with ``answer`` (None: never answers); yields
    the requests it received, headers included."""
    seen: list[Msg] = []

    async def on_request(msg: Msg) -> None:
        seen.append(msg)
        if answer is not None:
            await msg.respond(answer)

    async with client(url) as nc:
        await nc.subscribe(SUBJECT, cb=on_request)
        await Bus(nc).flush()  # the server knows the subscription (see Bus.flush)
        yield seen


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    connected = await Bus.connect(
        ConnectOptions(url=nats_url, name="ask-test", retry_forever=False)
    )
    try:
        yield connected
    finally:
        await connected.close()


async def test_a_good_reply_decodes_to_the_type_asked_for(nats_url: str, bus: Bus) -> None:
    async with asyncio.timeout(10), responder(nats_url, encode(RESULT)) as seen:
        assert await bus.ask(SUBJECT, REQUEST, SandboxResult, 2.0) == RESULT
        assert await ask(bus.nc, SUBJECT, REQUEST, SandboxResult, 2.0) == RESULT
    assert [msg.data for msg in seen] == [encode(REQUEST)] * 2


async def test_no_message_sends_an_empty_body(nats_url: str, bus: Bus) -> None:
    beat = Heartbeat(service="s", instance="i", state=ServiceState.RUNNING, healthy=True)
    async with asyncio.timeout(10), responder(nats_url, encode(beat)) as seen:
        assert await bus.ask(SUBJECT, None, Heartbeat, 2.0) == beat
    assert seen[0].data == b""


async def test_nobody_listening_is_no_responder(bus: Bus) -> None:
    with pytest.raises(NoResponder) as raised:
        await bus.ask(SUBJECT, REQUEST, SandboxResult, 2.0)
    assert raised.value.subject == SUBJECT
    assert str(raised.value) == f"no service answers on {SUBJECT}"


async def test_no_answer_in_time_is_a_timeout(nats_url: str, bus: Bus) -> None:
    async with responder(nats_url, None) as seen:
        with pytest.raises(AskTimeout) as raised:
            await bus.ask(SUBJECT, REQUEST, SandboxResult, 0.3)
    assert len(seen) == 1, "the request reached the responder, which kept quiet"
    assert (raised.value.subject, raised.value.timeout_s) == (SUBJECT, 0.3)
    assert "within 0.3s" in str(raised.value)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"\xc1 not msgpack", "not valid MessagePack"),
        (b"", "not valid MessagePack"),
        (encode(CommitReply(request_id="c")), "$.type"),
        (msgpack.packb({"type": "sandbox_result", "v": 1, "id": "q1"}), "status"),
    ],
    ids=["garbage", "empty", "another-type", "missing-field"],
)
async def test_a_reply_that_is_not_the_type_asked_for_is_bad(
    nats_url: str, bus: Bus, answer: bytes, reason: str
) -> None:
    async with asyncio.timeout(10), responder(nats_url, answer):
        with pytest.raises(BadReply) as raised:
            await bus.ask(SUBJECT, REQUEST, SandboxResult, 2.0)
    assert raised.value.subject == SUBJECT
    assert reason in raised.value.reason
    assert len(raised.value.reason) <= 300


async def test_an_error_reply_is_refused_with_its_fields(nats_url: str, bus: Bus) -> None:
    refusal = ErrorReply(code=ErrorCode.BAD_REQUEST, message="no such language", field="$.lang")
    async with asyncio.timeout(10), responder(nats_url, encode(refusal)):
        with pytest.raises(Refused) as raised:
            await bus.ask(SUBJECT, REQUEST, SandboxResult, 2.0)
    error = raised.value
    assert error.reply == refusal
    assert (error.code, error.message, error.field) == (
        ErrorCode.BAD_REQUEST,
        "no such language",
        "$.lang",
    )
    assert str(error).endswith("refused the request (bad_request): no such language (at $.lang)")


async def test_a_closed_connection_is_unsent(nats_url: str) -> None:
    async with client(nats_url) as nc:
        await nc.close()
        with pytest.raises(Unsent) as raised:
            await ask(nc, SUBJECT, REQUEST, SandboxResult, 1.0)
    assert raised.value.subject == SUBJECT


async def test_headers_that_push_a_request_over_the_limit_are_refused_before_sending(
    nats_url: str, bus: Bus
) -> None:
    """nats-py checks only the payload; the server, counting the headers too, would close
    the connection.  The connection stays up and answers the next request."""
    limit = bus.max_payload
    fill = limit - len(encode(SandboxExec(id="q1", code=""))) - 16
    big = SandboxExec(id="q1", code="x" * fill)
    assert limit - 32 < len(encode(big)) <= limit
    async with asyncio.timeout(10), responder(nats_url, encode(RESULT)):
        with structlog.contextvars.bound_contextvars(trace_id="t" * 64):
            with pytest.raises(Unsent) as raised:
                await bus.ask(SUBJECT, big, SandboxResult, 2.0)
            assert isinstance(raised.value.error, PayloadTooLarge)
            assert await bus.ask(SUBJECT, REQUEST, SandboxResult, 2.0) == RESULT
        assert await bus.ask(SUBJECT, big, SandboxResult, 2.0) == RESULT  # no headers: fits
    assert bus.nc.is_connected


async def test_every_failure_is_an_ask_error(bus: Bus) -> None:
    for kind in (NoResponder, AskTimeout, BadReply, Refused, Unsent):
        assert issubclass(kind, AskError)
    with pytest.raises(AskError):
        await bus.ask(SUBJECT, REQUEST, SandboxResult, 1.0)


async def test_the_trace_of_the_running_work_reaches_the_responder(nats_url: str, bus: Bus) -> None:
    async with asyncio.timeout(10), responder(nats_url, encode(RESULT)) as seen:
        with structlog.contextvars.bound_contextvars(trace_id="trace-of-task\r\nX: y"):
            await bus.ask(SUBJECT, REQUEST, SandboxResult, 2.0)
            await ask(bus.nc, SUBJECT, REQUEST, SandboxResult, 2.0, trace_id="given")
        await bus.ask(SUBJECT, REQUEST, SandboxResult, 2.0)
    traces = [(msg.headers or {}).get(h.TRACE_ID) for msg in seen]
    # Line breaks cannot end the header line: they arrive as spaces.
    assert traces == ["trace-of-task  X: y", "given", None]
    assert seen[2].headers is None, "without a trace a request carries no headers"


async def test_concurrent_asks_each_get_their_own_answer(nats_url: str, bus: Bus) -> None:
    async def on_request(msg: Msg) -> None:
        request = Codec(SandboxExec).decode(msg.data)
        await msg.respond(encode(SandboxResult(id=request.id, status=SandboxStatus.OK)))

    async with asyncio.timeout(10), client(nats_url) as nc:
        await nc.subscribe(SUBJECT, cb=on_request)
        await Bus(nc).flush()  # the server knows the subscription (see Bus.flush)
        asks = [
            bus.ask(SUBJECT, SandboxExec(id=f"q{i}", code="1"), SandboxResult, 2.0)
            for i in range(20)
        ]
        results = await asyncio.gather(*asks)
    assert [r.id for r in results] == [f"q{i}" for i in range(20)]
