"""Sandbox exec throughput and latency on the warm Docker pool, against baselines, in one run.

A trivial Python snippet runs at concurrency 4 along four paths, interleaved in
rounds so that every path shares the machine's noise:

- service: a SandboxExec request over NATS request/reply to a SandboxService with
  the Docker backend (pool of 4 warm containers), as a generator sends it;
- agent: the same snippet sent straight to the agent of the same warm containers
  over its unix socket (AgentClient.exec), without NATS or the service;
- docker exec: the docker CLI, ``docker exec CONTAINER python3 -c SNIPPET``, into
  the same warm containers (what a user would type; not the aiodocker exec API);
- host spawn: a bare ``python3 -c SNIPPET`` on the host (asyncio subprocess).

Added latency of a request = its round trip through the service (client send to
reply decoded) minus the run time the agent measured for that very exec
(the reply's ``duration_s``: from handing the run to a ready spare process to its
exit, inside the container).
Cold start = create + start + agent answering, through the backend's own creation
path (an exec shape outside the warm pool gets a dedicated, new container).

The service runs with its default settings but ``pool_size`` 4, so worn-out boxes
(``max_uses``) are replaced during the service rounds as in production; the client
shares the service's process and uvloop event loop (as in the integration tests).

Goals (issue 3): >= 300 execs/s through the service, >= 10x ``docker exec``, and
p50 added latency <= 3 ms.  Figures are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import nats
from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.messages import ErrorReply, SandboxExec, SandboxResult, SandboxStatus
from services.cli.common import run
from services.runtime import logs
from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from services.runtime.settings import RuntimeSettings
from services.sandbox.agent_client import ExecRequest
from services.sandbox.backend import Box
from services.sandbox.docker_backend import OWNER_LABEL, docker_problem
from services.sandbox.service import SandboxService
from services.sandbox.settings import SandboxSettings

REPO = Path(__file__).resolve().parents[1]

BUILD_SCRIPT = REPO / "deploy" / "sandbox" / "build-offline.sh"
#: build-offline.sh's exit status when docker, debootstrap or root is missing.
PREREQUISITE_MISSING = 3

SNIPPET = "pass"
CONCURRENCY = 4
POOL_SIZE = 4
ROUNDS = 5
#: Per round.  docker exec runs at a few tens per second: it gets fewer.
N_SERVICE = 600
N_AGENT = 400
N_DOCKER = 24
N_HOST = 100
#: Service requests before the first round (connections, code paths, caches).
WARMUP = 40
GOAL_RATE = 300.0
GOAL_RATIO = 10.0
GOAL_ADDED_P50_MS = 3.0


# ---------------------------------------------------------------- figures


@dataclass
class Lane:
    """One path's figures over every round."""

    rates: list[float] = field(default_factory=list)
    #: Round trip of each exec, seconds.
    latency: list[float] = field(default_factory=list)
    #: Run time of each exec as the agent measured it (service and agent paths).
    inside: list[float] = field(default_factory=list)
    failures: int = 0

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    def added(self) -> list[float]:
        return [total - run for total, run in zip(self.latency, self.inside, strict=True)]


@dataclass
class Figures:
    service: Lane = field(default_factory=Lane)
    agent: Lane = field(default_factory=Lane)
    docker: Lane = field(default_factory=Lane)
    host: Lane = field(default_factory=Lane)
    #: create -> agent ready of dedicated containers, one at a time.
    cold_start: list[float] = field(default_factory=list)
    #: the warm pool's own first creations (``max_creates`` at a time).
    pool_start: list[float] = field(default_factory=list)
    recycled: int = 0
    max_uses: int = 0
    python: str = "python3"
    image: str = ""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.2f} ms"  # 10 characters


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def render(fig: Figures) -> list[str]:
    """The table; pure, so it is testable without Docker."""
    svc, agent, docker, host = fig.service, fig.agent, fig.docker, fig.host

    def ratio(a: float, b: float) -> float:
        return a / b if b else 0.0

    def row(name: str, lane: Lane) -> str:
        span = f"[{min(lane.rates, default=0):.0f}-{max(lane.rates, default=0):.0f}]"
        return (
            f"  {name:<40}{lane.rate:>8.0f}  {span:<11}"
            f"{ms(percentile(lane.latency, 50))}{ms(percentile(lane.latency, 95))}"
        )

    def spread(label: str, values: Sequence[float], note: str = "") -> str:
        return (
            f"    {label:<38}p50 {ms(percentile(values, 50))}"
            f"   p95 {ms(percentile(values, 95))}{note}"
        )

    vs_docker = ratio(svc.rate, docker.rate)
    added = svc.added()
    added_p50 = percentile(added, 50)
    nats_and_service = percentile(svc.latency, 50) - percentile(agent.latency, 50)
    failures = svc.failures + agent.failures + docker.failures + host.failures
    return [
        f"sandbox exec of {SNIPPET!r} at concurrency {CONCURRENCY}, warm pool of {POOL_SIZE}"
        f" ({fig.image}), {ROUNDS} interleaved rounds",
        "",
        f"  {'path':<40}{'execs/s':>8}  {'[rounds]':<11}{'p50':>10}{'p95':>10}",
        row("service (NATS request/reply)", svc),
        row("agent direct (unix socket, same boxes)", agent),
        row("docker exec (docker CLI, same boxes)", docker),
        row("host spawn (python3 -c)", host),
        f"  execs/s: median of rounds; host python3: {fig.python}",
        "",
        f"  service / docker exec   {vs_docker:7.1f}x",
        f"  service / host spawn    {ratio(svc.rate, host.rate):7.1f}x",
        f"  service / agent direct  {ratio(svc.rate, agent.rate):7.2f}x",
        "",
        "  added latency = a request's round trip - its own run time in the container",
        "  (the reply's duration_s: hand-over to a spare -> exit, measured by the agent)",
        spread(f"service, per request ({len(added)})", added),
        spread("run time in the container (service)", svc.inside),
        spread("agent direct, same measure", agent.added(), "  (socket + agent only)"),
        f"    {'service p50 - agent direct p50':<38}    {ms(nats_and_service)}"
        "   (NATS + service + pool)",
        "",
        f"  cold start, create -> agent ready:  one at a time ({len(fig.cold_start)})"
        f"  p50 {ms(percentile(fig.cold_start, 50))}   max {ms(max(fig.cold_start, default=0))}",
        f"  {'':<36}warm pool's first ({len(fig.pool_start)})"
        f"  p50 {ms(percentile(fig.pool_start, 50))}   max {ms(max(fig.pool_start, default=0))}",
        f"  containers recycled (max_uses {fig.max_uses}) by the service rounds: {fig.recycled};"
        f" failed execs: {failures}",
        "",
        f"  goal: >= {GOAL_RATE:.0f} execs/s through the service  "
        f"{verdict(svc.rate >= GOAL_RATE)}  ({svc.rate:.0f}/s)",
        f"  goal: >= {GOAL_RATIO:.0f}x docker exec                 "
        f"{verdict(vs_docker >= GOAL_RATIO)}  ({vs_docker:.1f}x)",
        f"  goal: p50 added latency <= {GOAL_ADDED_P50_MS:.0f} ms          "
        f"{verdict(added_p50 * 1000 <= GOAL_ADDED_P50_MS)}  ({added_p50 * 1000:.2f} ms)",
    ]


# ---------------------------------------------------------------- prerequisites


def build_image() -> tuple[str | None, str]:
    """(image tag, "") or (None, why not).  Cached by content hash: fast after the first time."""
    build = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1200)
    if build.returncode != 0:
        prefix = "prerequisite missing" if build.returncode == PREREQUISITE_MISSING else "failed"
        return None, f"build-offline.sh {prefix}: {build.stderr.strip()[-300:]}"
    lines = build.stdout.strip().splitlines()
    return (lines[-1], "") if lines else (None, "build-offline.sh printed no tag")


# ---------------------------------------------------------------- load


async def drive(count: int, one: Callable[[int], Awaitable[None]]) -> float:
    """Run ``one(i)`` for i in range(count) on CONCURRENCY workers; the rate per second."""
    next_index = iter(range(count))

    async def worker() -> None:
        for i in next_index:
            await one(i)

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(CONCURRENCY):
            group.create_task(worker())
    return count / (time.perf_counter() - started)


async def spawn(argv: Sequence[str]) -> bool:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return await proc.wait() == 0
    finally:
        if proc.returncode is None:  # cancelled: leave nothing running
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


class Bench:
    def __init__(self, image: str, nats_url: str, state_dir: Path) -> None:
        self.settings = SandboxSettings(
            runtime=RuntimeSettings(
                nats_url=nats_url, instance="bench-sandbox", heartbeat_s=5, stats_s=60, grace_s=5
            ),
            backend="docker",
            image=image,
            pool_size=POOL_SIZE,
            state_dir=state_dir,
            snapshot_dir=state_dir / "snapshots",
        )
        self.service = SandboxService(self.settings)
        self.fig = Figures(image=image, python=host_python(), max_uses=self.settings.max_uses)

    async def run(self) -> Figures:
        async with self.service:
            await self.wait_warm()
            self.fig.pool_start = [
                float(s) for s in getattr(self.service.backend, "cold_start_s", [])
            ]
            nc = await nats.connect(self.settings.runtime.nats_url)
            try:
                await self.service_round(nc, WARMUP, record=False)
                await self.wait_warm()
                for _ in range(ROUNDS):
                    recycled_before = self.recycled()
                    await self.service_round(nc, N_SERVICE)
                    await self.wait_warm()  # worn-out boxes replaced: part of the service's cost
                    self.fig.recycled += self.recycled() - recycled_before
                    await self.agent_round()
                    await self.docker_round()
                    await self.host_round()
                    await self.cold_start()
                    await self.wait_warm()
            finally:
                await nc.close()
        return self.fig

    def recycled(self) -> int:
        return int(self.service.backend.statistics()["sandboxes_recycled"])

    async def wait_warm(self, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s):
            # The pool exposes no event: poll its idle count, under the timeout.
            while self.service.backend.statistics()["pool_idle"] < POOL_SIZE:  # noqa: ASYNC110
                await asyncio.sleep(0.02)

    # -- a. the service path

    async def service_round(self, nc: NATS, count: int, record: bool = True) -> None:
        replies: Codec[SandboxResult | ErrorReply] = Codec(SandboxResult | ErrorReply)
        subject = subjects.sandbox_exec()
        path = self.fig.service

        async def one(i: int) -> None:
            started = time.perf_counter()
            payload = encode(SandboxExec(id=f"b{i}", code=SNIPPET))
            msg = await nc.request(subject, payload, timeout=30)
            reply = replies.decode(msg.data)
            elapsed = time.perf_counter() - started
            if not isinstance(reply, SandboxResult) or reply.status is not SandboxStatus.OK:
                path.failures += 1
                return
            if record:
                path.latency.append(elapsed)
                path.inside.append(reply.duration_s)

        rate = await drive(count, one)
        if record:
            path.rates.append(rate)

    # -- b. straight to the agents of the same warm containers

    async def lease(self) -> list[Box]:
        backend = self.service.backend
        return [await backend.acquire(self.settings.defaults) for _ in range(POOL_SIZE)]

    async def give_back(self, boxes: list[Box]) -> None:
        for box in boxes:
            await self.service.backend.release(box)

    async def agent_round(self) -> None:
        limits = self.settings.defaults
        path = self.fig.agent
        boxes = await self.lease()
        free: asyncio.Queue[Box] = asyncio.Queue()
        for box in boxes:
            free.put_nowait(box)

        async def one(i: int) -> None:
            box = await free.get()
            try:
                request = ExecRequest(
                    id=f"a{i}",
                    code=SNIPPET,
                    language="python",
                    timeout_s=limits.timeout_s,
                    output_bytes=limits.output_bytes,
                )
                started = time.perf_counter()
                reply = await box.agent.exec(request, timeout_s=limits.timeout_s + 3)
                elapsed = time.perf_counter() - started
            finally:
                free.put_nowait(box)
            if reply.status is not SandboxStatus.OK:
                path.failures += 1
                return
            path.latency.append(elapsed)
            path.inside.append(reply.duration_s)

        try:
            path.rates.append(await drive(N_AGENT, one))
        finally:
            await self.give_back(boxes)

    # -- c. docker exec into the same warm containers

    async def docker_round(self) -> None:
        path = self.fig.docker
        boxes = await self.lease()
        free: asyncio.Queue[Box] = asyncio.Queue()
        for box in boxes:
            free.put_nowait(box)

        async def one(_: int) -> None:
            box = await free.get()
            try:
                started = time.perf_counter()
                ok = await spawn(["docker", "exec", box.id, "python3", "-c", SNIPPET])
                elapsed = time.perf_counter() - started
            finally:
                free.put_nowait(box)
            if ok:
                path.latency.append(elapsed)
            else:
                path.failures += 1

        try:
            path.rates.append(await drive(N_DOCKER, one))
        finally:
            await self.give_back(boxes)

    # -- d. a bare host spawn

    async def host_round(self) -> None:
        path = self.fig.host

        async def one(_: int) -> None:
            started = time.perf_counter()
            ok = await spawn([self.fig.python, "-c", SNIPPET])
            if ok:
                path.latency.append(time.perf_counter() - started)
            else:
                path.failures += 1

        path.rates.append(await drive(N_HOST, one))

    # -- e. cold start through the backend's own creation path

    async def cold_start(self) -> None:
        backend = self.service.backend
        # A shape outside the warm pool: acquire() creates a dedicated container, and
        # release() removes it.
        odd = replace(self.settings.defaults, disk_mb=self.settings.defaults.disk_mb + 1)
        started = time.perf_counter()
        box = await backend.acquire(odd)
        self.fig.cold_start.append(time.perf_counter() - started)
        await backend.release(box)


def host_python() -> str:
    """A plain host interpreter: the system one where there is one.

    Not a pyenv/asdf shim (a shell script) and not an interpreter whose site-packages
    import things at start-up (a ``.pth`` hook costs more than the spawn itself).
    """
    for candidate in (Path("/usr/bin/python3"), Path(sys.base_prefix) / "bin" / "python3"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("python3") or "python3"


def owner() -> str:
    """The owner label the Docker backend puts on this process's containers."""
    return f"{socket.gethostname()}:{os.getpid()}"


def leftovers(owner: str) -> list[str]:
    """Ids of containers this process's backend created that still exist."""
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label={OWNER_LABEL}={owner}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return listed.stdout.split()


def main() -> int:
    problem = docker_problem()
    if problem is not None:
        print(f"bench_sandbox: {problem}")
        print("skipped: no Docker engine")
        return 0
    image, why = build_image()
    if image is None:
        print(f"bench_sandbox: cannot build the sandbox image: {why}")
        print("skipped: no sandbox image")
        return 0

    # Quiet: the service's info logs (and its disconnect warning on stop) would cut the table.
    logs.configure("bench-sandbox", level="error")
    started = time.perf_counter()
    # AF_UNIX socket paths are short: the state dir lives directly under /tmp.
    state_dir = Path(tempfile.mkdtemp(prefix="tsb-bench-"))
    try:
        with tempfile.TemporaryDirectory() as store:
            server = NatsServer(NatsServerSettings(store_dir=Path(store), port=RANDOM_PORT))
            server.start()
            try:
                # Services run on uvloop (services.cli.common.run); so do the clients here.
                fig = run(lambda: Bench(image, server.url, state_dir).run())
            finally:
                server.stop()
    finally:
        stray = leftovers(owner())
        if stray:  # the service removes its containers on stop; this is the safety net
            subprocess.run(["docker", "rm", "-f", *stray], capture_output=True, timeout=60)
        shutil.rmtree(state_dir, ignore_errors=True)
    for line in render(fig):
        print(line)
    print(f"  (run took {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
