"""``temper status`` and ``check`` exit codes (unhealthy, no control), and no NATS at all."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.codec import encode
from protocol.messages import Heartbeat, PolicyUpdate, ServiceState, StackStatus
from services.control import ControlService, ControlSettings
from tests.integration.support import SERVICE_NAME, TaskService, client, runtime
from tests.integration.test_cli_harness import free_port, temper


def control(url: str) -> ControlService:
    return ControlService(ControlSettings(runtime=runtime(url, instance="ctl")))


async def test_status_exits_1_when_a_service_is_unhealthy(nats_url: str) -> None:
    async with asyncio.timeout(30), client(nats_url) as nc, control(nats_url):
        sick = Heartbeat(
            service="sick",
            instance="s1",
            state=ServiceState.RUNNING,
            healthy=False,
            sent_at=time.time(),
            detail="gpu lost",
        )
        await nc.publish(subjects.heartbeat("sick"), encode(sick))
        await nc.flush()
        while True:  # bounded by the timeout above
            done = await temper(nats_url, "status")
            if "sick" in done.out:
                break
            await asyncio.sleep(0.05)
        assert done.code == 1
        assert any(
            line.split()[:4] == ["sick", "s1", "running", "UNHEALTHY"] and "gpu lost" in line
            for line in done.out.splitlines()
        )
        assert any(
            line.split()[:4] == ["control", "ctl", "running", "healthy"]
            for line in done.out.splitlines()
        )

        as_json = await temper(nats_url, "status", "--json")
        assert as_json.code == 1
        decoded = msgspec.json.decode(as_json.out, type=StackStatus)
        assert {(s.service, s.healthy) for s in decoded.services} == {
            ("control", True),
            ("sick", False),
        }


async def test_status_without_control_lists_what_answers_a_ping(nats_url: str) -> None:
    async with asyncio.timeout(30), TaskService(runtime(nats_url, instance="solo")):
        done = await temper(nats_url, "status", "--timeout", "0.5")
    assert done.code == 1
    assert "no control service answered" in done.out
    assert any(
        line.split() == [SERVICE_NAME, "solo", "running", "healthy"]
        for line in done.out.splitlines()
    )


async def test_check_a_running_service(nats_url: str) -> None:
    async with asyncio.timeout(30), TaskService(runtime(nats_url, instance="solo")):
        done = await temper(nats_url, "check", SERVICE_NAME)
    assert done.code == 0, done.err
    assert done.out.strip() == f"{SERVICE_NAME}: healthy (running, instance solo)"


async def test_commands_with_no_nats_fail_fast_and_clearly(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    commands = (
        ["status"],
        ["check", "control"],
        ["tail", "temper.v1.>"],
        ["dlq", "list"],
        ["record", "temper.v1.>", str(tmp_path / "out.jsonl")],
    )
    results = await asyncio.gather(*(temper(url, *argv, timeout_s=15) for argv in commands))
    for argv, done in zip(commands, results, strict=True):
        assert done.code == 1, argv
        assert done.err.startswith(f"temper: cannot reach NATS at {url}"), done.err
        assert done.err.count("cannot reach NATS") == 1
        assert "Traceback" not in done.err


async def test_status_shows_gone_instances_and_generator_versions(nats_url: str) -> None:
    """Needs `temper status` to print through services.cli.status_view."""
    settings = ControlSettings(
        runtime=runtime(nats_url, instance="ctl"),
        stale_after_s=0.2,
        gone_after_s=0.4,
        forget_after_s=60.0,
        lagging_after_s=0.2,
    )
    async with asyncio.timeout(30), client(nats_url) as nc, ControlService(settings):
        update = PolicyUpdate(version=5, uri="/weights/v5", digest="sha256:" + "0" * 64)
        await nc.jetstream().publish(subjects.policy_update(), encode(update))
        dead = Heartbeat(service="replay", instance="r1", state=ServiceState.RUNNING, healthy=True)
        await nc.publish(subjects.heartbeat("replay"), encode(dead))
        async with asyncio.TaskGroup() as group:
            # The generators stay alive however long the command takes to start.
            pump = group.create_task(_generators_beating(nc, {"g-old": 3, "g-new": 5}))
            while True:  # bounded by the timeout above
                done = await temper(nats_url, "status")
                if "g-new" in done.out and " gone " in done.out and "lagging" in done.out:
                    break
                await asyncio.sleep(0.05)
            pump.cancel()
    rows = {line.split()[1]: line.split() for line in done.out.splitlines()[2:]}
    assert rows["r1"][:5] == ["replay", "r1", "gone", "-", "-"]
    assert rows["g-old"][:6] == ["generator", "g-old", "running", "healthy", "v3", "lagging"]
    assert rows["g-new"][:6] == ["generator", "g-new", "running", "healthy", "v5", "0"]
    assert done.code == 1  # replay's only instance is gone: the stack lacks a service


async def _generators_beating(nc: NATS, versions: dict[str, int]) -> None:
    while True:
        for instance, version in versions.items():
            beat = Heartbeat(
                service="generator",
                instance=instance,
                state=ServiceState.RUNNING,
                healthy=True,
                policy_version=version,
            )
            await nc.publish(subjects.heartbeat("generator"), encode(beat))
        await asyncio.sleep(0.05)
