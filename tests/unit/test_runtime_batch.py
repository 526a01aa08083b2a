"""The batch path's pieces without a server: ack subjects, publish replies and commands, the
ack inbox, pulls."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from protocol.errors import PayloadTooLarge
from services.runtime.bus import (
    Publication,
    StreamAck,
    _AckInbox,
    _Pending,
    ack_command,
    header_block,
    pub_result,
    publish_command,
)
from services.runtime.consumer import ack_numbers, delivery_of
from services.runtime.pull import Puller, PullFailed, PullRequest, next_subject

V1_ACK = "$JS.ACK.TEMPER_ROLLOUTS.validator.3.1042.977.1796021541230000000.12"
V2_ACK = "$JS.ACK.hub.ACCHASH.TEMPER_ROLLOUTS.validator.4.1043.978.1796021541230000000.11.rand"


def msg(
    subject: str = "s", data: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
) -> Msg:
    return Msg(_client=None, subject=subject, reply=reply, data=data, headers=headers)  # type: ignore[arg-type]


# ---------------------------------------------------------------- deliveries


@pytest.mark.parametrize(("reply", "expected"), [(V1_ACK, (3, 1042)), (V2_ACK, (4, 1043))])
def test_ack_numbers_read_the_delivery_count_and_stream_sequence(
    reply: str, expected: tuple[int, int]
) -> None:
    assert ack_numbers(msg(reply=reply)) == expected
    # The same as nats-py's own (slower) parse.
    meta = msg(reply=reply).metadata
    assert expected == (meta.num_delivered, meta.sequence.stream)


def test_a_message_without_an_ack_subject_is_no_delivery() -> None:
    with pytest.raises(NotJSMessageError):
        ack_numbers(msg(reply="_INBOX.abc"))


def test_batch_delivery_carries_the_trace_id_and_the_message() -> None:
    delivered = msg(subject="temper.v1.rollout.x", reply=V1_ACK, headers={"Temper-Trace-Id": "t1"})
    delivery = delivery_of(delivered)
    assert (delivery.trace_id, delivery.num_delivered, delivery.stream_seq) == ("t1", 3, 1042)
    assert delivery.subject == "temper.v1.rollout.x" and delivery.msg is delivered
    assert delivery_of(msg(reply=V1_ACK)).trace_id == ""


# ---------------------------------------------------------------- publish replies


def test_a_stream_ack_is_decoded() -> None:
    ack = pub_result(msg(data=b'{"stream":"TEMPER_SCORED","seq":7,"duplicate":true}'))
    assert ack == StreamAck(stream="TEMPER_SCORED", seq=7, duplicate=True)
    assert pub_result(msg(data=b'{"stream":"S","seq":1}')) == StreamAck(stream="S", seq=1)


def test_a_jetstream_error_keeps_its_codes() -> None:
    body = b'{"error":{"code":400,"err_code":10060,"description":"expected stream does not match"}}'
    error = pub_result(msg(data=body))
    assert isinstance(error, nats.js.errors.APIError)
    assert (error.code, error.err_code) == (400, 10060)
    assert error.description == "expected stream does not match"


def test_no_stream_on_the_subject_is_its_own_error() -> None:
    assert isinstance(
        pub_result(msg(headers={"Status": "503"})), nats.js.errors.NoStreamResponseError
    )
    other = pub_result(msg(headers={"Status": "408"}))
    assert isinstance(other, nats.js.errors.APIError) and other.code == 408


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"seq": "x"}'])
def test_an_unreadable_reply_is_an_error_not_a_crash(body: bytes) -> None:
    assert isinstance(pub_result(msg(data=body)), nats.js.errors.APIError)


# ---------------------------------------------------------------- the ack inbox


async def test_acks_settle_their_own_items_in_any_order() -> None:
    inbox = _AckInbox("_INBOX.test.")
    pending = _Pending(3)
    replies = [inbox.expect(pending, index) for index in range(3)]
    assert len(set(replies)) == 3 and all(r.startswith("_INBOX.test.") for r in replies)
    await inbox._on_reply(msg(subject=replies[2], data=b'{"stream":"S","seq":12}'))
    await inbox._on_reply(msg(subject=replies[0], data=b'{"stream":"S","seq":10}'))
    assert not pending.done.is_set()
    await inbox._on_reply(msg(subject=replies[1], headers={"Status": "503"}))
    await pending.wait(1.0)
    assert [getattr(r, "seq", None) for r in pending.results] == [10, None, 12]
    assert isinstance(pending.results[1], nats.js.errors.NoStreamResponseError)


async def test_what_gets_no_ack_in_time_times_out_and_a_late_ack_is_ignored() -> None:
    inbox = _AckInbox("_INBOX.test.")
    pending = _Pending(2)
    first, second = inbox.expect(pending, 0), inbox.expect(pending, 1)
    await inbox._on_reply(msg(subject=first, data=b'{"stream":"S","seq":1}'))
    await pending.wait(0.01)
    inbox.forget_all(pending)
    assert isinstance(pending.results[0], StreamAck)
    assert isinstance(pending.results[1], nats.errors.TimeoutError)
    await inbox._on_reply(msg(subject=second, data=b'{"stream":"S","seq":2}'))  # too late
    assert isinstance(pending.results[1], nats.errors.TimeoutError)
    assert not inbox._waiting


async def test_an_empty_publish_waits_for_nothing() -> None:
    pending = _Pending(0)
    await asyncio.wait_for(pending.wait(10.0), 0.5)
    assert pending.results == []


async def test_a_failed_write_settles_only_what_still_waits() -> None:
    inbox = _AckInbox("_INBOX.test.")
    pending = _Pending(3)
    replies = [inbox.expect(pending, index) for index in range(3)]
    inbox.forget(replies[1])
    pending.settle(1, PayloadTooLarge(10, 5, "payload"))
    await inbox._on_reply(msg(subject=replies[0], data=b'{"stream":"S","seq":1}'))
    inbox.fail(pending, nats.errors.ConnectionClosedError())
    await asyncio.wait_for(pending.wait(10.0), 0.5)
    assert isinstance(pending.results[0], StreamAck)
    assert isinstance(pending.results[1], PayloadTooLarge)
    assert isinstance(pending.results[2], nats.errors.ConnectionClosedError)
    assert not inbox._waiting


# ---------------------------------------------------------------- commands written in bulk


async def nats_py_bytes(
    subject: str, payload: bytes, reply: str, headers: dict[str, str] | None
) -> bytes:
    """What nats-py's publish() queues for the socket (no connection needed to build it)."""
    client = Client()
    await client._send_publish(subject, reply, payload, len(payload), headers)
    [command] = client._pending
    return command


@pytest.mark.parametrize(
    "headers",
    [
        {"Temper-Version": "1", "Nats-Msg-Id": "arithmetic-1/0"},
        {" Spaced ": "  padded  ", "": "dropped", "Broken": "one\r\ntwo\nthree"},
        {},
    ],
)
async def test_a_publish_command_is_the_bytes_nats_py_writes(headers: dict[str, str]) -> None:
    item = Publication("temper.v1.scored.d.t", b"\x00payload\r\n", headers)
    expected = await nats_py_bytes(item.subject, item.payload, "_INBOX.x.7", headers)
    assert publish_command(item, "_INBOX.x.7", 1024) == expected


async def test_an_ack_command_is_the_bytes_msg_ack_writes() -> None:
    written = await nats_py_bytes(V1_ACK, b"", "", None)
    # nats-py leaves the empty reply field in ("PUB <subject>  0"); the server reads both alike.
    assert ack_command(V1_ACK) == written.replace(b"  ", b" ")


def test_what_the_server_would_refuse_is_refused_before_it_is_written() -> None:
    item = Publication("s", b"x" * 10, {"K": "v"})
    exact = len(header_block(item.headers)) + 10
    assert publish_command(item, "r", exact).endswith(b"x" * 10 + b"\r\n")
    with pytest.raises(PayloadTooLarge):
        publish_command(item, "r", exact - 1)
    for subject in ("", "a b", "a\r\nPUB x 0"):
        with pytest.raises(nats.errors.BadSubjectError):
            publish_command(item._replace(subject=subject), "r", 1024)
    with pytest.raises(nats.errors.BadHeaderError):
        publish_command(item._replace(headers={"Bad:Name": "v"}), "r", 1024)
    with pytest.raises(nats.errors.BadSubjectError):
        ack_command("")


# ---------------------------------------------------------------- the puller


class FakeServer:
    """Plays the server's side of pull requests: ``script`` answers each request in turn."""

    def __init__(self, script: list[Callable[[PullRequest], list[Msg]]]) -> None:
        self.script = script
        self.requests: list[PullRequest] = []
        self.callback: Callable[[Msg], Awaitable[None]] | None = None
        self.inbox = "_INBOX.fake"

    def new_inbox(self) -> str:
        return self.inbox

    async def subscribe(self, subject: str, cb: Callable[[Msg], Awaitable[None]]) -> Any:
        assert subject == self.inbox
        self.callback = cb
        return self

    async def unsubscribe(self) -> None:
        self.callback = None

    async def publish(self, subject: str, payload: bytes, reply: str) -> None:
        assert subject == next_subject("S", "d") and reply == self.inbox
        request = msgspec.json.decode(payload, type=PullRequest)
        self.requests.append(request)
        answer = self.script.pop(0)(request)
        asyncio.get_running_loop().call_soon(asyncio.ensure_future, self._deliver(answer))

    async def _deliver(self, msgs: list[Msg]) -> None:
        assert self.callback is not None
        for delivered in msgs:
            await self.callback(delivered)


def deliveries(count: int, start: int = 0) -> list[Msg]:
    return [msg(data=str(start + i).encode(), reply=V1_ACK) for i in range(count)]


def status(code: str) -> Msg:
    return msg(headers={"Status": code, "Description": "x"})


async def started(server: FakeServer) -> Puller:
    puller = Puller(server, "S", "d")  # type: ignore[arg-type]
    await puller.start()
    return puller


async def test_what_is_there_now_comes_from_one_no_wait_request() -> None:
    server = FakeServer([lambda request: [*deliveries(3), status("404")]])
    puller = await started(server)
    got = await puller.fetch(10, wait_s=5.0)
    assert [m.data for m in got] == [b"0", b"1", b"2"]
    assert server.requests == [PullRequest(batch=10, no_wait=True)]


async def test_an_empty_stream_is_waited_on_by_a_lingering_request() -> None:
    server = FakeServer([lambda request: [status("404")], lambda request: deliveries(4)])
    puller = await started(server)
    got = await puller.fetch(4, wait_s=2.0)
    assert len(got) == 4  # a full batch ends the request without a status
    assert server.requests[1] == PullRequest(batch=4, expires=2_000_000_000)


async def test_an_expired_request_returns_nothing() -> None:
    server = FakeServer([lambda request: [status("404")], lambda request: [status("408")]])
    puller = await started(server)
    assert await puller.fetch(4, wait_s=0.05) == []


async def test_a_refused_request_raises() -> None:
    server = FakeServer([lambda request: [status("409")]])
    puller = await started(server)
    with pytest.raises(PullFailed) as raised:
        await puller.fetch(4, wait_s=1.0)
    assert raised.value.status == "409"


async def test_late_deliveries_are_handed_out_next_and_returned_on_close() -> None:
    server = FakeServer([lambda request: [*deliveries(2), status("404")]])
    puller = await started(server)
    await puller.fetch(2, wait_s=1.0)
    await server._deliver(deliveries(3, start=10))  # e.g. the rest of an expired request
    first = await puller.fetch(2, wait_s=1.0)  # enough buffered: no request at all
    assert [m.data for m in first] == [b"10", b"11"] and len(server.requests) == 1
    assert [m.data for m in await puller.close()] == [b"12"]


async def test_heartbeats_do_not_end_a_request() -> None:
    server = FakeServer([lambda request: [status("100"), *deliveries(2)]])
    puller = await started(server)
    assert len(await puller.fetch(2, wait_s=1.0)) == 2


def test_a_pull_request_says_only_what_it_sets() -> None:
    assert msgspec.json.encode(PullRequest(batch=5, no_wait=True)) == b'{"batch":5,"no_wait":true}'
    assert msgspec.json.encode(PullRequest(batch=5, expires=10)) == b'{"batch":5,"expires":10}'
