"""Delivery contracts: nothing lost on stop or crash, long work kept alive, poison dead-lettered."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from nats.aio.client import Client as NATS

from protocol import headers as h
from protocol import streams, subjects
from protocol.codec import Codec
from protocol.errors import ErrorCode
from protocol.messages import ErrorEvent, ServiceState, Task
from services.runtime import ConsumerTuning, Delivery, Reject
from services.runtime.procs import child_preexec
from tests.integration.support import (
    DURABLE,
    SERVICE_NAME,
    TASK_STREAM,
    TASK_SUBJECT,
    TASKS,
    Inbox,
    TaskService,
    client,
    consumer_spec,
    counter,
    declare,
    make_task,
    publish_tasks,
    runtime,
    stream_entries,
    wait_count,
    wait_entries,
)

REPO = Path(__file__).resolve().parents[2]
DLQ_SUBJECT = subjects.dead_letter(TASK_STREAM)
EVENTS_SUBJECT = subjects.error_event(SERVICE_NAME)


async def test_graceful_stop_finishes_or_hands_back_everything(nats_url: str) -> None:
    total, stop_after = 40, 8

    async def slow(task: Task, delivery: Delivery) -> None:
        await asyncio.sleep(0.05)

    tuning = ConsumerTuning(max_in_flight=4, fetch_wait_s=0.1, nak_delay_s=0.05)
    spec = consumer_spec(ack_wait_s=2.0)
    async with client(nats_url) as nc, asyncio.timeout(20):
        js = nc.jetstream()
        await declare(js)
        ids = await publish_tasks(js, range(total))

        first = TaskService(runtime(nats_url, "first"), slow, spec=spec, tuning=tuning)
        await first.start()
        await first.wait_for(lambda: len(first.handled) >= stop_after)
        await first.stop()
        done_first = set(first.handled)
        assert stop_after <= len(done_first) < total
        # Within the grace period every started handler finished (and was acked).
        assert {seen.id for seen in first.seen} == done_first
        # Acked work left the work queue; everything else is still in it.
        await wait_count(js, TASK_STREAM, total - len(done_first))

        second = TaskService(runtime(nats_url, "second"), slow, spec=spec, tuning=tuning)
        async with second:
            await second.wait_for(
                lambda: len(done_first | set(second.handled)) == total, timeout_s=15
            )
        assert done_first.isdisjoint(second.handled)
        assert done_first | set(second.handled) == set(ids)
        assert len(second.handled) == len(set(second.handled))
        await wait_count(js, TASK_STREAM, 0)


async def test_grace_expiry_hands_back_in_flight_work_at_once(nats_url: str) -> None:
    async def forever(task: Task, delivery: Delivery) -> None:
        await asyncio.Event().wait()

    # ack_wait is long: the second delivery must come from the nak, not from the timeout.
    spec = consumer_spec(ack_wait_s=30.0)
    async with client(nats_url) as nc, asyncio.timeout(10):
        js = nc.jetstream()
        await declare(js)
        first = TaskService(runtime(nats_url, "first", grace_s=0.05), forever, spec=spec)
        await first.start()
        await publish_tasks(js, [1])
        await first.wait_for(lambda: len(first.seen) == 1)
        await first.stop()
        assert first.handled == []
        assert counter(first, "handed_back", source=TASK_STREAM) == 1

        second = TaskService(runtime(nats_url, "second"), spec=spec)
        async with second:
            await second.wait_for(lambda: second.handled == ["t1"], timeout_s=5)
        assert [seen.num_delivered for seen in second.seen] == [2]
        await wait_count(js, TASK_STREAM, 0)


async def crash_while_handling(
    nc: NATS, nats_url: str, *, ack_wait: float, max_deliver: int = 5
) -> None:
    """A service process receives task t1 and is SIGKILLed before it can ack."""
    signal_subject = "test.crash.received"
    inbox = await Inbox.open(nc, signal_subject)
    await publish_tasks(nc.jetstream(), [1])
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.crash_service",
        nats_url,
        "--signal",
        signal_subject,
        "--ack-wait",
        str(ack_wait),
        "--max-deliver",
        str(max_deliver),
        "--durable",
        DURABLE,
        cwd=REPO,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=child_preexec(),
    )
    try:
        try:
            received = await inbox.next(timeout_s=15)
        except TimeoutError:
            proc.kill()
            _, err = await proc.communicate()
            raise AssertionError(
                f"crash_service never received the task:\n{err.decode()}"
            ) from None
        assert received.data == b"t1 1"
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.communicate()
    assert proc.returncode == -signal.SIGKILL


async def test_killed_before_acking_is_redelivered_after_ack_wait(nats_url: str) -> None:
    ack_wait = 1.0
    async with client(nats_url) as nc, asyncio.timeout(30):
        js = nc.jetstream()
        await declare(js)
        await crash_while_handling(nc, nats_url, ack_wait=ack_wait)

        service = TaskService(
            runtime(nats_url, "survivor"), spec=consumer_spec(ack_wait_s=ack_wait)
        )
        async with service:
            await service.wait_for(lambda: service.handled == ["t1"], timeout_s=10)
        assert service.seen[0].num_delivered >= 2
        await wait_count(js, TASK_STREAM, 0)


async def test_crash_on_the_last_delivery_is_dead_lettered(nats_url: str) -> None:
    """No handler ever returns, so only the server's max-deliveries advisory can tell."""
    ack_wait = 0.5
    spec = consumer_spec(ack_wait_s=ack_wait, max_deliver=1)
    async with client(nats_url) as nc, asyncio.timeout(30):
        js = nc.jetstream()
        await declare(js)
        await crash_while_handling(nc, nats_url, ack_wait=ack_wait, max_deliver=1)
        [original] = await stream_entries(js, TASK_STREAM)

        async with TaskService(runtime(nats_url, "survivor"), spec=spec) as service:
            [entry] = await wait_entries(js, streams.DEAD_LETTERS.name, 1, subject=DLQ_SUBJECT)
            # The work queue would otherwise keep it forever: nobody may take it again.
            await wait_count(js, TASK_STREAM, 0)
        assert service.handled == []
        assert entry.data == original.data
        hdrs = entry.headers or {}
        assert hdrs[h.DLQ_CODE] == "max_deliver"
        assert hdrs[h.DLQ_DELIVERIES] == "1"
        assert "not acknowledged after 1 deliveries" in hdrs[h.DLQ_REASON]
        assert hdrs[h.DLQ_SUBJECT] == TASK_SUBJECT


async def test_in_progress_acks_keep_long_work_from_redelivery(nats_url: str) -> None:
    ack_wait = 0.5

    async def long(task: Task, delivery: Delivery) -> None:
        await asyncio.sleep(3 * ack_wait)

    async with client(nats_url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        async with TaskService(
            runtime(nats_url), long, spec=consumer_spec(ack_wait_s=ack_wait)
        ) as service:
            await publish_tasks(js, [1])
            await service.wait_for(lambda: service.handled == ["t1"], timeout_s=10)
            # Had ack_wait passed without an in-progress ack, the server would have
            # delivered it again while the handler still ran.
            assert [(seen.id, seen.num_delivered) for seen in service.seen] == [("t1", 1)]
            info = await js.consumer_info(TASK_STREAM, DURABLE)
            assert info.num_redelivered == 0
        await wait_count(js, TASK_STREAM, 0)


async def test_duplicate_publish_is_stored_and_handled_once(nats_url: str) -> None:
    async with client(nats_url) as nc, asyncio.timeout(10):
        js = nc.jetstream()
        async with TaskService(runtime(nats_url)) as service:
            task = make_task("dup")
            first = await service.bus.publish(TASK_SUBJECT, task, msg_id="dup-1")
            second = await service.bus.publish(TASK_SUBJECT, task, msg_id="dup-1")
            assert not first.duplicate
            assert second.duplicate is True
            assert second.seq == first.seq
            await publish_tasks(js, ["after"])
            await service.wait_for(lambda: "tafter" in service.handled)
            assert service.handled.count("tdup") == 1
            assert (await js.stream_info(TASK_STREAM)).state.last_seq == 2


async def test_poison_message_goes_to_the_dead_letter_stream_after_max_deliver(
    nats_url: str,
) -> None:
    async def fails_on_poison(task: Task, delivery: Delivery) -> None:
        if task.id == "tpoison":
            raise ValueError("boom on purpose")

    async with client(nats_url) as nc, asyncio.timeout(15):
        js = nc.jetstream()
        await declare(js)
        raw = TASKS.encode(make_task("poison"))
        spec = consumer_spec(max_deliver=3)
        async with TaskService(runtime(nats_url), fails_on_poison, spec=spec) as service:
            await js.publish(
                TASK_SUBJECT, raw, headers={h.TRACE_ID: "trace-poison", h.MSG_ID: "poison"}
            )
            [entry] = await wait_entries(js, streams.DEAD_LETTERS.name, 1, subject=DLQ_SUBJECT)
            assert entry.data == raw
            hdrs = entry.headers or {}
            assert hdrs[h.DLQ_CODE] == "max_deliver"
            assert hdrs[h.DLQ_DELIVERIES] == "3"
            assert "ValueError" in hdrs[h.DLQ_REASON] and "boom on purpose" in hdrs[h.DLQ_REASON]
            assert hdrs[h.DLQ_SUBJECT] == TASK_SUBJECT
            assert hdrs[h.DLQ_SOURCE] == TASK_STREAM
            assert hdrs[h.DLQ_SERVICE] == SERVICE_NAME
            assert hdrs[h.TRACE_ID] == "trace-poison"

            [event_entry] = await wait_entries(js, streams.ERRORS.name, 1, subject=EVENTS_SUBJECT)
            event = Codec(ErrorEvent).decode(event_entry.data)
            assert event.code is ErrorCode.MAX_DELIVER
            assert event.original == raw and not event.truncated
            assert event.subject == TASK_SUBJECT
            assert event.trace_id == "trace-poison"
            assert "boom on purpose" in event.message

            assert [s.num_delivered for s in service.seen if s.id == "tpoison"] == [1, 2, 3]
            await wait_count(js, TASK_STREAM, 0)

            assert service.state is ServiceState.RUNNING and not service.crashed.is_set()
            await publish_tasks(js, ["good"])
            await service.wait_for(lambda: "tgood" in service.handled)
            assert counter(service, "failed", source=TASK_STREAM) == 3
            assert counter(service, "dead_lettered", source=TASK_STREAM) == 1


async def test_reject_dead_letters_at_once(nats_url: str) -> None:
    async def rejects(task: Task, delivery: Delivery) -> None:
        if task.id == "thopeless":
            raise Reject(ErrorCode.VALIDATION, "no reference answer", field="$.metadata.answer")

    async with client(nats_url) as nc, asyncio.timeout(10):
        js = nc.jetstream()
        await declare(js)
        raw = TASKS.encode(make_task("hopeless"))
        async with TaskService(
            runtime(nats_url), rejects, spec=consumer_spec(max_deliver=5)
        ) as service:
            await js.publish(TASK_SUBJECT, raw)
            [entry] = await wait_entries(js, streams.DEAD_LETTERS.name, 1, subject=DLQ_SUBJECT)
            assert entry.data == raw
            hdrs = entry.headers or {}
            assert hdrs[h.DLQ_CODE] == "validation"
            assert hdrs[h.DLQ_DELIVERIES] == "1"
            assert hdrs[h.DLQ_FIELD] == "$.metadata.answer"
            assert hdrs[h.DLQ_REASON] == "no reference answer"
            [event_entry] = await wait_entries(js, streams.ERRORS.name, 1, subject=EVENTS_SUBJECT)
            event = Codec(ErrorEvent).decode(event_entry.data)
            assert (event.code, event.field, event.original) == (
                ErrorCode.VALIDATION,
                "$.metadata.answer",
                raw,
            )
            await wait_count(js, TASK_STREAM, 0)
            assert [s.num_delivered for s in service.seen] == [1]
            await publish_tasks(js, ["fine"])
            await service.wait_for(lambda: "tfine" in service.handled)
