"""Request/reply through ``Service.respond``: typed replies, typed errors, a shared queue group."""

from __future__ import annotations

import asyncio
from collections import Counter

import msgpack
from nats.aio.client import Client as NATS

from protocol import headers as h
from protocol import streams, subjects
from protocol.codec import ANY, Codec
from protocol.errors import ErrorCode
from protocol.messages import (
    ErrorEvent,
    ErrorReply,
    Message,
    SandboxExec,
    SandboxResult,
    SandboxStatus,
)
from services.runtime import Request, RequestRejected, RuntimeSettings, Service
from tests.integration.support import client, counter, runtime, stream_count, wait_entries

SUBJECT = subjects.sandbox_exec()
EXEC = Codec(SandboxExec)


class EchoService(Service):
    """Answers SandboxExec: ``code`` says how (``reject``, ``crash``, anything else runs).
    As an ``observer`` it only watches the subject (its answers go nowhere)."""

    name = "rt-echo"
    streams = (streams.ERRORS, streams.DEAD_LETTERS)

    def __init__(self, runtime: RuntimeSettings, *, observer: bool = False) -> None:
        super().__init__(runtime)
        self.served: list[str] = []
        self._observer = observer

    async def setup(self) -> None:
        if self._observer:
            self.listen(SUBJECT, EXEC, self._exec, observer=True)
        else:
            self.respond(SUBJECT, EXEC, self._exec)

    async def _exec(self, request: SandboxExec, ctx: Request) -> Message:
        if request.code == "reject":
            raise RequestRejected(ErrorCode.BAD_REQUEST, "language not allowed", field="$.language")
        if request.code == "crash":
            raise RuntimeError("sandbox exploded")
        self.served.append(request.id)
        return SandboxResult(
            id=request.id, status=SandboxStatus.OK, stdout=self.instance, exit_code=0
        )


async def _ask(nc: NATS, payload: bytes, headers: dict[str, str] | None = None) -> Message:
    reply = await nc.request(SUBJECT, payload, timeout=2, headers=headers)
    return ANY.decode(reply.data)


async def test_replies_and_typed_errors(nats_url: str) -> None:
    async with (
        client(nats_url) as nc,
        asyncio.timeout(15),
        EchoService(runtime(nats_url)) as service,
    ):
        good = await _ask(nc, EXEC.encode(SandboxExec(id="r1", code="print(1)")))
        assert isinstance(good, SandboxResult)
        assert (good.id, good.status, good.exit_code) == ("r1", SandboxStatus.OK, 0)

        garbage = await _ask(nc, b"\xc1 not msgpack", headers={h.TRACE_ID: "trace-garbage"})
        assert isinstance(garbage, ErrorReply)
        assert garbage.code is ErrorCode.NOT_MSGPACK and garbage.message

        invalid = {"type": "sandbox_exec", "v": 1, "id": 7, "code": "x"}
        wrong = await _ask(nc, msgpack.packb(invalid))
        assert isinstance(wrong, ErrorReply)
        assert (wrong.code, wrong.field) == (ErrorCode.VALIDATION, "$.id")

        rejected = await _ask(nc, EXEC.encode(SandboxExec(id="r2", code="reject")))
        assert isinstance(rejected, ErrorReply)
        assert (rejected.code, rejected.field) == (ErrorCode.BAD_REQUEST, "$.language")
        assert rejected.message == "language not allowed"

        crashed = await _ask(nc, EXEC.encode(SandboxExec(id="r3", code="crash")))
        assert isinstance(crashed, ErrorReply)
        assert crashed.code is ErrorCode.INTERNAL
        assert "sandbox exploded" in crashed.message

        # Still serving, never crashed.
        again = await _ask(nc, EXEC.encode(SandboxExec(id="r4", code="print(2)")))
        assert isinstance(again, SandboxResult) and again.id == "r4"
        assert not service.crashed.is_set()
        assert service.served == ["r1", "r4"]

        # Undecodable requests are reported with their bytes, like bad stream input.
        js = nc.jetstream()
        events = await wait_entries(
            js, streams.ERRORS.name, 2, subject=subjects.error_event(service.name)
        )
        decoded = [Codec(ErrorEvent).decode(e.data) for e in events]
        garbage_event = next(e for e in decoded if e.trace_id == "trace-garbage")
        assert garbage_event.code is ErrorCode.NOT_MSGPACK
        assert garbage_event.original == b"\xc1 not msgpack"
        assert garbage_event.subject == SUBJECT
        dead = await wait_entries(
            js, streams.DEAD_LETTERS.name, 2, subject=subjects.dead_letter(service.name)
        )
        assert {e.data for e in dead} == {b"\xc1 not msgpack", msgpack.packb(invalid)}
        assert {(e.headers or {})[h.DLQ_CODE] for e in dead} == {"not_msgpack", "validation"}


async def test_instances_share_requests_through_the_queue_group(nats_url: str) -> None:
    total = 40
    async with client(nats_url) as nc, asyncio.timeout(15):
        first, second = EchoService(runtime(nats_url, "one")), EchoService(runtime(nats_url, "two"))
        async with first, second:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            for i in range(total):
                payload = EXEC.encode(SandboxExec(id=f"q{i}", code="ok"))
                await nc.publish(SUBJECT, payload, reply=inbox)
            replies = [ANY.decode((await sub.next_msg(timeout=2)).data) for _ in range(total)]
            # Every request answered exactly once (no second answer arrives), by either instance.
            await nc.flush()
            await asyncio.sleep(0.1)
            assert sub.pending_msgs == 0
            assert sorted(r.id for r in replies) == sorted(f"q{i}" for i in range(total))
            by_instance = Counter(r.stdout for r in replies)
            assert set(by_instance) == {"one", "two"}
            assert len(first.served) + len(second.served) == total
            assert set(first.served).isdisjoint(second.served)


async def test_an_observer_never_replies_and_leaves_bad_input_to_the_consumer(
    nats_url: str,
) -> None:
    """Its reply would reach the publisher's inbox, where a JetStream publish waits for
    the stream's ack; bad input is counted, not dead-lettered a second time."""
    async with client(nats_url) as nc, asyncio.timeout(15):
        async with EchoService(runtime(nats_url), observer=True) as service:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            for payload in (
                b"\xc1 not msgpack",
                EXEC.encode(SandboxExec(id="w1", code="crash")),
                EXEC.encode(SandboxExec(id="w2", code="print(1)")),
            ):
                await nc.publish(SUBJECT, payload, reply=inbox)
            while service.served != ["w2"]:
                await asyncio.sleep(0.01)
            await nc.flush()
            await asyncio.sleep(0.2)
            assert sub.pending_msgs == 0, "no reply of any kind"
            assert counter(service, "bad_input", source=service.name, code="not_msgpack") == 1
            assert not service.crashed.is_set()
        js = nc.jetstream()
        assert await stream_count(js, streams.DEAD_LETTERS.name) == 0
        assert await stream_count(js, streams.ERRORS.name) == 0
