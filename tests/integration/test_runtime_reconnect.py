"""A nats-server crash in the middle of a stream loses nothing; the service reconnects by itself."""

from __future__ import annotations

import asyncio

import nats.errors
from nats.js import JetStreamContext

from protocol.messages import ServiceState, Task
from services.runtime import ConsumerTuning, Delivery
from services.runtime.natsserver import NatsServer
from tests.integration.support import (
    TASK_STREAM,
    TASK_SUBJECT,
    TASKS,
    TaskService,
    client,
    consumer_spec,
    declare,
    make_task,
    runtime,
    wait_count,
)


async def _publish_with_retry(js: JetStreamContext, ids: range) -> None:
    """Publish each task until the stream acknowledges it; the msg id makes a retry harmless."""
    for i in ids:
        task = make_task(i)
        while True:
            try:
                await js.publish(
                    TASK_SUBJECT, TASKS.encode(task), headers={"Nats-Msg-Id": task.id}, timeout=0.5
                )
                break
            except (nats.errors.Error, TimeoutError):
                await asyncio.sleep(0.05)


async def test_server_killed_mid_stream_loses_nothing(nats_server: NatsServer) -> None:
    total, kill_after = 300, 60
    url = nats_server.url

    async def step(task: Task, delivery: Delivery) -> None:
        await asyncio.sleep(0.01)

    # A short ack_wait: what the crash swallowed (acks, pulls in flight) comes back quickly.
    spec = consumer_spec(ack_wait_s=1.0, max_deliver=100)
    tuning = ConsumerTuning(
        max_in_flight=4, fetch_wait_s=0.1, nak_delay_s=0.05, error_backoff_s=0.05
    )
    ids = {make_task(i).id for i in range(total)}
    async with client(url) as nc, asyncio.timeout(40):
        js = nc.jetstream()
        await declare(js)
        service = TaskService(runtime(url), step, spec=spec, tuning=tuning)
        async with service:
            publisher = asyncio.create_task(_publish_with_retry(js, range(total)))
            try:
                await service.wait_for(lambda: len(service.handled) >= kill_after)
                await asyncio.to_thread(nats_server.kill)
                await asyncio.sleep(0.3)  # down long enough for fetches, acks and publishes to fail
                assert len(set(service.handled)) < total
                await asyncio.to_thread(nats_server.start)
                assert nats_server.url == url
                await publisher
            finally:
                publisher.cancel()

            await service.wait_for(lambda: set(service.handled) == ids, timeout_s=30)
            assert not service.crashed.is_set()
            assert service.state is ServiceState.RUNNING
            assert service.bus.nc.is_connected
            # Every task handled; the work queue drains once the last acks land.
            await wait_count(js, TASK_STREAM, 0, timeout_s=10)
        assert not service.crashed.is_set()
