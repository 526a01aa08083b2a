"""``temper status`` and ``check`` exit codes (unhealthy, no control), and no NATS at all."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec

from protocol import subjects
from protocol.codec import encode
from protocol.messages import Heartbeat, ServiceState, StackStatus
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
