"""Service lifecycle against a real nats-server: start/stop, control plane, stats and metrics."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine
from typing import Any

from protocol import subjects
from protocol.messages import Heartbeat, ServiceState, Stats, Task
from services.runtime import Delivery
from tests.integration.support import (
    TASK_STREAM,
    Inbox,
    TaskService,
    client,
    declare,
    publish_tasks,
    runtime,
)


async def test_start_twice_is_a_no_op_and_stop_twice_is_safe(nats_url: str) -> None:
    service = TaskService(runtime(nats_url))
    assert service.state is ServiceState.STARTING
    async with asyncio.timeout(10):
        await service.start()
        await service.start()
        assert service.state is ServiceState.RUNNING
        assert service.setups == 1
        await service.stop()
        assert service.stopped.is_set()
        assert service.state is ServiceState.STOPPED
        await service.stop()
    assert service.state is ServiceState.STOPPED
    assert not service.crashed.is_set()


async def test_concurrent_stops_all_return_after_the_service_stopped(nats_url: str) -> None:
    release = asyncio.Event()

    async def slow(task: Task, delivery: Delivery) -> None:
        await release.wait()

    async with client(nats_url) as nc:
        js = nc.jetstream()
        await declare(js)
        service = TaskService(runtime(nats_url), slow)
        async with asyncio.timeout(10):
            await service.start()
            await publish_tasks(js, [1])
            await service.wait_for(lambda: len(service.seen) == 1)
            stops = [asyncio.create_task(service.stop()) for _ in range(3)]
            await asyncio.sleep(0.05)
            # Draining: in-flight work holds every stopper back.
            assert not any(stop.done() for stop in stops)
            assert service.state is ServiceState.DRAINING
            release.set()
            await asyncio.gather(*stops)
    assert service.stopped.is_set()
    assert service.state is ServiceState.STOPPED
    assert service.handled == ["t1"]


async def test_async_with_starts_and_stops(nats_url: str) -> None:
    service = TaskService(runtime(nats_url))
    async with asyncio.timeout(10):
        async with service as running:
            assert running is service
            assert service.state is ServiceState.RUNNING
            assert service.bus.nc.is_connected
            assert not service.stopped.is_set()
    assert service.stopped.is_set()
    assert service.state is ServiceState.STOPPED
    assert service.bus.nc.is_closed


async def test_stop_before_start_sets_stopped(nats_url: str) -> None:
    service = TaskService(runtime(nats_url))
    async with asyncio.timeout(5):
        await service.stop()
    assert service.stopped.is_set()
    assert service.state is ServiceState.STOPPED


async def test_health_and_ping_answer_with_a_heartbeat(nats_url: str) -> None:
    async with client(nats_url) as nc, asyncio.timeout(10):
        async with TaskService(runtime(nats_url, instance="hb-1")) as service:
            for subject in (subjects.health(service.name), subjects.ping()):
                reply = await nc.request(subject, b"", timeout=2)
                message = _decode_heartbeat(reply.data)
                assert message.service == service.name
                assert message.instance == "hb-1"
                assert message.state is ServiceState.RUNNING
                assert message.healthy is True
            # Any payload is accepted by a probe: it is not read.
            reply = await nc.request(subjects.health(service.name), b"\xc1garbage", timeout=2)
            assert _decode_heartbeat(reply.data).healthy is True


async def test_health_reports_draining_while_work_finishes(nats_url: str) -> None:
    release = asyncio.Event()

    async def slow(task: Task, delivery: Delivery) -> None:
        await release.wait()

    async with client(nats_url) as nc, asyncio.timeout(10):
        js = nc.jetstream()
        await declare(js)
        service = TaskService(runtime(nats_url), slow)
        await service.start()
        await publish_tasks(js, [1])
        await service.wait_for(lambda: len(service.seen) == 1)
        stop = asyncio.create_task(service.stop())
        await asyncio.sleep(0.05)
        reply = await nc.request(subjects.health(service.name), b"", timeout=2)
        beat = _decode_heartbeat(reply.data)
        assert beat.state is ServiceState.DRAINING
        assert beat.healthy is False
        assert beat.in_flight == 1
        release.set()
        await stop


async def test_heartbeats_are_published_and_the_last_says_stopped(nats_url: str) -> None:
    async with client(nats_url) as nc, asyncio.timeout(10):
        inbox = await Inbox.open(nc, subjects.heartbeat(TaskService.name))
        service = TaskService(runtime(nats_url, instance="hb-2", heartbeat_s=0.05))
        await service.start()
        running = [await inbox.next_message() for _ in range(3)]
        assert all(isinstance(beat, Heartbeat) for beat in running)
        assert {beat.instance for beat in running} == {"hb-2"}
        assert any(beat.state is ServiceState.RUNNING and beat.healthy for beat in running)
        await service.stop()
        last = await inbox.until(lambda beat: beat.state is ServiceState.STOPPED)
        assert last.healthy is False


async def test_stats_and_metrics_count_what_was_handled(nats_url: str) -> None:
    async with client(nats_url) as nc, asyncio.timeout(10):
        js = nc.jetstream()
        await declare(js)
        stats_inbox = await Inbox.open(nc, subjects.stats(TaskService.name))
        service = TaskService(runtime(nats_url, instance="st-1", metrics_port=0))
        async with service:
            await publish_tasks(js, range(3))
            await service.wait_for(lambda: len(service.handled) == 3)

            def counted(stats: Stats) -> bool:
                return stats.values.get("acked") == 3.0

            stats = await stats_inbox.until(lambda m: isinstance(m, Stats) and counted(m))
            assert stats.service == service.name
            assert stats.instance == "st-1"
            assert stats.values["received"] == 3.0
            assert stats.values.get("failed", 0.0) == 0.0
            assert stats.values["in_flight"] == 0.0

            port = service.metrics_port
            assert port is not None and port > 0
            text = await _http_get("127.0.0.1", port, "/metrics")
            assert _sample(text, "temper_received_total", TASK_STREAM) == 3.0
            assert _sample(text, "temper_acked_total", TASK_STREAM) == 3.0
            assert re.search(r'^temper_up\{service="rt-test"\} 1\.0$', text, re.M)
            missing = await _http_get("127.0.0.1", port, "/nope", expect=b"404")
            assert "not found" in missing
        # Stopped: the endpoint is closed.
        assert service.metrics_port is None
        try:
            await _http_get("127.0.0.1", port, "/metrics")
        except OSError:
            pass
        else:
            raise AssertionError("metrics endpoint still serving after stop")


def _decode_heartbeat(data: bytes) -> Heartbeat:
    from protocol.codec import Codec

    return Codec(Heartbeat).decode(data)


def _sample(text: str, name: str, source: str) -> float:
    match = re.search(rf'^{name}\{{source="{source}"\}} (\S+)$', text, re.M)
    assert match, f"{name}{{source={source!r}}} not in metrics:\n{text}"
    return float(match.group(1))


async def _http_get(host: str, port: int, path: str, expect: bytes = b"200") -> str:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == expect, head
    return body.decode()


class ForgetfulLoop(TaskService):
    """A background loop that drops the first cancel it gets, as Python 3.11's wait_for does
    when a request's answer arrives together with the cancel (nats-py's request and fetch)."""

    def __init__(self, nats_url: str) -> None:
        super().__init__(runtime(nats_url))
        self.cancels = 0
        self.looping = asyncio.Event()

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [self._loop()]

    async def _loop(self) -> None:
        while True:
            self.looping.set()
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                self.cancels += 1
                if self.cancels > 1:
                    raise


async def test_stop_ends_a_loop_that_dropped_a_cancel(nats_url: str) -> None:
    service = ForgetfulLoop(nats_url)
    await service.start()
    async with asyncio.timeout(10):
        await service.looping.wait()
        await service.stop()
    assert service.cancels == 2
    assert service.state is ServiceState.STOPPED
