"""``/metrics`` is on by default: ``temper up`` gives every service its loopback port, each
answers a scrape with its figures (which move as a task goes through), ``temper status``
lists the endpoints, and stopping the stack closes them all.  A busy port leaves a
service running without metrics."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
from pathlib import Path

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from protocol.client import TemperClient
from protocol.messages import ChatMessage, StackStatus, Task
from services import registry
from tests.integration import test_supervisor
from tests.integration.support import TaskService, runtime
from tests.integration.test_cli_harness import temper
from tests.integration.test_supervisor import Up, stack, wait_gone
from tests.required import unavailable

#: The stacks a test starts, killed at teardown (the fixture of the supervisor tests).
ups = test_supervisor.ups
PORTS = registry.metrics_ports(sorted(registry.BUILTIN))
#: Figures each service has from the start (a learner's step figures come with a step).
FIGURES = {
    "control": ("temper_control_uptime_s",),
    "generator": (
        "temper_generator_generated_tokens",
        "temper_generator_cache_hit_ratio",
        "temper_generator_rollouts_ok",
        "temper_generator_weight_update_failures",
    ),
    "learner": ("temper_learner_policy_version", "temper_learner_weight_ack_incomplete"),
    "replay": ("temper_replay_held", "temper_replay_leased"),
    "sandbox": ("temper_sandbox_executed",),
    "validator": ("temper_validator_published",),
}


def port_in_use(port: int) -> bool:
    """Bound as the metrics server binds (SO_REUSEADDR: closed connections do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


async def scrape(port: int) -> dict[str, float]:
    """Sample name (with its labels) -> value, from ``GET /metrics`` on 127.0.0.1."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def names(samples: dict[str, float]) -> set[str]:
    return {key.split("{")[0] for key in samples}


async def work_shows(url: str) -> None:
    """One task of two samples through generator and validator, until their figures say so."""
    task = Task(
        id="metrics-17-plus-25",
        domain="arithmetic",
        prompt=[ChatMessage(role="user", content="What is 17 + 25?")],
        metadata={"answer": "42"},
        n=2,
    )
    async with await TemperClient.connect(url) as client:
        await client.submit(task)
    judged = 'temper_validator_rollouts_total{domain="arithmetic",status="scored"}'
    while (await scrape(PORTS["validator"])).get(judged) != 2.0:
        await asyncio.sleep(0.2)
    generated = await scrape(PORTS["generator"])
    assert generated["temper_generator_rollouts_ok"] == 2.0
    assert generated["temper_generator_generated_tokens"] > 0
    assert "temper_validator_seconds_bucket" in names(await scrape(PORTS["validator"]))


async def test_up_serves_metrics_on_every_service_by_default(
    ups: list[Up], tmp_path: Path, tiny_model: Path
) -> None:
    busy = [port for port in PORTS.values() if port_in_use(port)]
    if busy:
        reason = f"default metrics ports {busy} are taken (another stack on this machine?)"
        unavailable("free default metrics ports", reason, flag="TEMPER_REQUIRE_PORTS")
    up, _, _ = await stack(ups, tmp_path, "--model", str(tiny_model), new_session=True)
    printed = "".join(up.lines)
    for name, port in PORTS.items():
        said = rf"{name}\s+healthy, metrics http://127\.0\.0\.1:{port}/metrics$"
        assert re.search(said, printed, re.MULTILINE), printed

    for name, port in PORTS.items():
        samples = await scrape(port)
        assert samples[f'temper_up{{service="{name}"}}'] == 1.0
        assert set(FIGURES[name]) <= names(samples), name

    status = await temper(up.url, "status")
    assert status.code == 0, status.out + status.err
    for name, port in PORTS.items():
        listed = rf"^{name}\s+\S+\s+running\s+healthy\s.*\shttp://127\.0\.0\.1:{port}/metrics\b"
        assert re.search(listed, status.out, re.MULTILINE), status.out
    as_json = msgspec.json.decode((await temper(up.url, "status", "--json")).out, type=StackStatus)
    assert {s.service: s.metrics_url for s in as_json.services} == {
        name: f"http://127.0.0.1:{port}/metrics" for name, port in PORTS.items()
    }

    async with asyncio.timeout(60):
        await work_shows(up.url)

    pids = list(up.pids)
    os.killpg(up.proc.pid, signal.SIGINT)
    await up.rest()
    assert up.proc.returncode == 0
    await wait_gone(pids, timeout_s=15)
    assert not [port for port in PORTS.values() if port_in_use(port)]


async def test_a_busy_metrics_port_leaves_the_service_running_without_metrics(
    nats_url: str,
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        service = TaskService(runtime(nats_url, instance="busy", metrics_port=port))
        async with asyncio.timeout(30), service:
            assert service.metrics_port is None
            beat = service.heartbeat()
            assert beat.healthy and beat.metrics_url == ""
    free = TaskService(runtime(nats_url, instance="free", metrics_port=0))
    async with asyncio.timeout(30), free:
        assert free.heartbeat().metrics_url == f"http://127.0.0.1:{free.metrics_port}/metrics"
