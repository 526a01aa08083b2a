"""The control service: heartbeats of every instance -> one StackStatus answer."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable

import msgpack
import pytest
from nats.aio.client import Client as NATS
from nats.js import api

from protocol import streams, subjects
from protocol.client import TemperClient
from protocol.codec import ANY, encode
from protocol.errors import ErrorCode
from protocol.messages import (
    ErrorReply,
    Heartbeat,
    PolicyUpdate,
    ServiceState,
    ServiceStatus,
    StackStatus,
)
from services.control import ControlService, ControlSettings
from services.runtime.procs import child_preexec
from tests.integration.support import (
    SERVICE_NAME,
    TASK_STREAM,
    TaskService,
    client,
    publish_tasks,
    runtime,
)
from tests.integration.test_cli_harness import ROOT

WAIT_S = 5.0


def control(url: str, **settings: float) -> ControlService:
    return ControlService(ControlSettings(runtime=runtime(url, instance="ctl"), **settings))


@pytest.fixture
async def temper(nats_url: str) -> AsyncIterator[TemperClient]:
    async with await TemperClient.connect(nats_url) as client_:
        yield client_


def find(status: StackStatus, service: str, instance: str) -> ServiceStatus | None:
    return next(
        (s for s in status.services if (s.service, s.instance) == (service, instance)), None
    )


async def status_until(
    temper: TemperClient, predicate: Callable[[StackStatus], bool], timeout_s: float = WAIT_S
) -> StackStatus:
    """Ask for the status until ``predicate`` holds (fails with TimeoutError otherwise)."""
    async with asyncio.timeout(timeout_s):
        while True:
            status = await temper.status(timeout_s=1.0)
            if predicate(status):
                return status
            await asyncio.sleep(0.05)


async def fake_heartbeat(
    nc: NATS,
    service: str,
    instance: str,
    *,
    state: ServiceState = ServiceState.RUNNING,
    healthy: bool = True,
    in_flight: int = 0,
    detail: str = "",
    policy_version: int | None = None,
) -> None:
    """One heartbeat as a service would send it, and then silence."""
    beat = Heartbeat(
        service=service,
        instance=instance,
        state=state,
        healthy=healthy,
        sent_at=time.time(),
        in_flight=in_flight,
        detail=detail,
        policy_version=policy_version,
    )
    await nc.publish(subjects.heartbeat(service), encode(beat))
    await nc.flush()


async def test_reports_itself_and_a_running_service_as_healthy(
    nats_url: str, temper: TemperClient
) -> None:
    async with asyncio.timeout(15), control(nats_url), TaskService(runtime(nats_url)):
        status = await status_until(temper, lambda s: find(s, SERVICE_NAME, "a") is not None)
        me = find(status, "control", "ctl")
        other = find(status, SERVICE_NAME, "a")
        assert me is not None and other is not None
        assert (me.state, me.healthy) == (ServiceState.RUNNING, True)
        assert (other.state, other.healthy, other.detail) == (ServiceState.RUNNING, True, "")
        assert 0 <= other.age_s < 5
        assert [(s.service, s.instance) for s in status.services] == sorted(
            (s.service, s.instance) for s in status.services
        )
        assert status.at > 0


async def test_a_stopped_service_is_removed(nats_url: str, temper: TemperClient) -> None:
    # Stale and forget timers far away: only the STOPPED heartbeat can remove the instance.
    async with asyncio.timeout(15), control(nats_url, stale_after_s=60, forget_after_s=60):
        service = TaskService(runtime(nats_url))
        await service.start()
        await status_until(temper, lambda s: find(s, SERVICE_NAME, "a") is not None)
        await service.stop()
        status = await status_until(temper, lambda s: find(s, SERVICE_NAME, "a") is None)
        assert find(status, "control", "ctl") is not None


async def test_silent_instance_turns_unhealthy_then_is_forgotten(
    nats_url: str, temper: TemperClient
) -> None:
    async with (
        asyncio.timeout(15),
        client(nats_url) as nc,
        control(nats_url, stale_after_s=0.3, forget_after_s=1.0),
    ):
        await fake_heartbeat(nc, "ghost", "g1", in_flight=3, detail="warming up")
        fresh = await status_until(temper, lambda s: find(s, "ghost", "g1") is not None)
        ghost = find(fresh, "ghost", "g1")
        assert ghost is not None
        assert (ghost.healthy, ghost.in_flight, ghost.detail) == (True, 3, "warming up")

        stale = await status_until(temper, lambda s: not _healthy(s, "ghost", "g1"))
        ghost = find(stale, "ghost", "g1")
        assert ghost is not None
        assert ghost.age_s > 0.3
        assert ghost.detail.startswith("no heartbeat for")
        assert ghost.state is ServiceState.RUNNING

        gone = await status_until(temper, lambda s: find(s, "ghost", "g1") is None)
        assert find(gone, "control", "ctl") is not None


async def test_a_killed_instance_is_shown_gone_then_dropped(
    nats_url: str, temper: TemperClient
) -> None:
    """kill -9: no STOPPED heartbeat, only silence, tells the control service."""
    bounds = {"stale_after_s": 0.3, "gone_after_s": 0.8, "forget_after_s": 2.0}
    async with asyncio.timeout(40), control(nats_url, **bounds):
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "tests.integration.crash_service", nats_url),
            *("--signal", "test.unused"),
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            preexec_fn=child_preexec(),
        )
        try:
            await status_until(temper, lambda s: _healthy(s, SERVICE_NAME, "doomed"), 20.0)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        killed_at = time.monotonic()

        silent = await status_until(temper, lambda s: not _healthy(s, SERVICE_NAME, "doomed"))
        doomed = find(silent, SERVICE_NAME, "doomed")
        assert doomed is not None and not doomed.gone

        gone = await status_until(temper, lambda s: _gone(s, SERVICE_NAME, "doomed"))
        doomed = find(gone, SERVICE_NAME, "doomed")
        assert doomed is not None
        assert (doomed.state, doomed.healthy) == (ServiceState.RUNNING, False)
        assert doomed.age_s > 0.8
        assert doomed.detail.startswith("no heartbeat for")
        me = find(gone, "control", "ctl")
        assert me is not None and not me.gone and me.healthy

        await status_until(temper, lambda s: find(s, SERVICE_NAME, "doomed") is None)
        assert time.monotonic() - killed_at < 2.0 + 1.0


async def test_a_generator_behind_the_newest_policy_for_too_long_is_lagging(
    nats_url: str, temper: TemperClient
) -> None:
    async with asyncio.timeout(15), client(nats_url) as nc:
        js = nc.jetstream()
        await js.add_stream(name=streams.POLICY.name, subjects=list(streams.POLICY.subjects))
        # Announced before the control service started: it reads the stream at start.
        await js.publish(subjects.policy_update(), encode(_update(4)))
        async with control(nats_url, lagging_after_s=0.5):
            await fake_heartbeat(nc, "generator", "g-old", policy_version=3)
            await fake_heartbeat(nc, "generator", "g-new", policy_version=4)
            early = await status_until(temper, lambda s: find(s, "generator", "g-old") is not None)
            old = find(early, "generator", "g-old")
            assert old is not None and (old.policy_version, old.lagging) == (3, False)

            late = await status_until(temper, lambda s: _lags(s, "g-old"))
            new = find(late, "generator", "g-new")
            assert new is not None and (new.policy_version, new.lagging) == (4, False)

            await js.publish(subjects.policy_update(), encode(_update(5)))
            await fake_heartbeat(nc, "generator", "g-new", policy_version=4)
            await status_until(temper, lambda s: _lags(s, "g-new"))


def _update(version: int) -> PolicyUpdate:
    return PolicyUpdate(version=version, uri=f"/weights/v{version}", digest="sha256:" + "0" * 64)


async def test_unhealthy_and_draining_heartbeats_are_reported(
    nats_url: str, temper: TemperClient
) -> None:
    async with asyncio.timeout(15), client(nats_url) as nc, control(nats_url):
        await fake_heartbeat(nc, "sick", "s1", healthy=False, detail="gpu lost")
        await fake_heartbeat(nc, "drain", "d1", state=ServiceState.DRAINING, healthy=False)
        status = await status_until(
            temper, lambda s: None not in (find(s, "sick", "s1"), find(s, "drain", "d1"))
        )
        sick, drain = find(status, "sick", "s1"), find(status, "drain", "d1")
        assert sick is not None and drain is not None
        assert (sick.healthy, sick.detail) == (False, "gpu lost")
        assert (drain.state, drain.healthy) == (ServiceState.DRAINING, False)
        # A newer heartbeat replaces the older one.
        await fake_heartbeat(nc, "sick", "s1", healthy=True)
        await status_until(temper, lambda s: _healthy(s, "sick", "s1"))
        # An explicit STOPPED heartbeat removes it at once.
        await fake_heartbeat(nc, "sick", "s1", state=ServiceState.STOPPED, healthy=False)
        await status_until(temper, lambda s: find(s, "sick", "s1") is None)


async def test_streams_and_dead_letters_are_counted(nats_url: str, temper: TemperClient) -> None:
    async with asyncio.timeout(15), client(nats_url) as nc, control(nats_url):
        js = nc.jetstream()
        await publish_tasks(js, ["s1", "s2", "s3"])
        watcher = api.ConsumerConfig(durable_name="watcher", ack_policy=api.AckPolicy.EXPLICIT)
        await js.add_consumer(TASK_STREAM, watcher)
        for i in range(2):
            await js.publish(subjects.dead_letter(TASK_STREAM), f"dead {i}".encode())

        status = await temper.status()
        assert [s.name for s in status.streams] == [spec.name for spec in streams.ALL]
        by_name = {s.name: s for s in status.streams}
        tasks = by_name[TASK_STREAM]
        assert (tasks.messages, tasks.consumers, tasks.pending) == (3, 1, 3)
        assert tasks.bytes > 0
        assert by_name[streams.DEAD_LETTERS.name].messages == 2
        assert status.dead_letters == 2
        assert by_name[streams.ROLLOUTS.name].messages == 0


async def test_a_missing_stream_is_left_out(nats_url: str, temper: TemperClient) -> None:
    async with asyncio.timeout(15), client(nats_url) as nc, control(nats_url):
        await nc.jetstream().delete_stream(streams.POLICY.name)
        status = await temper.status()
        assert streams.POLICY.name not in [s.name for s in status.streams]
        assert len(status.streams) == len(streams.ALL) - 1


@pytest.mark.parametrize(
    ("payload", "code", "field"),
    [
        (b"\xc1 garbage", ErrorCode.NOT_MSGPACK, None),
        (msgpack.packb({"type": "status_request", "v": 9}), ErrorCode.UNSUPPORTED_VERSION, "$.v"),
        (msgpack.packb({"type": "nonsense", "v": 1}), ErrorCode.UNKNOWN_TYPE, "$.type"),
    ],
)
async def test_a_garbage_status_request_gets_an_error_reply(
    nats_url: str, temper: TemperClient, payload: bytes, code: ErrorCode, field: str | None
) -> None:
    async with asyncio.timeout(15), client(nats_url) as nc, control(nats_url):
        reply = ANY.decode((await nc.request(subjects.status(), payload, timeout=2)).data)
        assert isinstance(reply, ErrorReply)
        assert reply.code is code
        if field is not None:
            assert reply.field == field
        assert reply.message
        # The service keeps answering good requests.
        status = await temper.status()
        assert find(status, "control", "ctl") is not None


def _gone(status: StackStatus, service: str, instance: str) -> bool:
    found = find(status, service, instance)
    return found is not None and found.gone


def _lags(status: StackStatus, instance: str) -> bool:
    found = find(status, "generator", instance)
    return found is not None and found.lagging


def _healthy(status: StackStatus, service: str, instance: str) -> bool:
    found = find(status, service, instance)
    return found is not None and found.healthy


async def test_instances_started_before_control_are_listed_at_once(
    nats_url: str, temper: TemperClient
) -> None:
    # A heartbeat every minute: only the roll call can make the instance known in time.
    async with asyncio.timeout(15), TaskService(runtime(nats_url, heartbeat_s=60.0)):
        await asyncio.sleep(0.3)  # its first heartbeat is out, with nobody listening
        async with control(nats_url):
            status = await status_until(
                temper, lambda s: find(s, SERVICE_NAME, "a") is not None, timeout_s=3.0
            )
    other = find(status, SERVICE_NAME, "a")
    assert other is not None and other.healthy
