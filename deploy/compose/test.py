"""``make compose-test``: the compose stack with host networking, end to end.

Builds the offline image (cached), brings the stack up under a project name of its own
with NATS on a free loopback port, submits tasks until it sees scored rollouts and a policy
update, scales to two validators and two sandbox services and sees each instance serve,
then takes everything down and checks that nothing is left: no container, volume or
network of the project, no sandbox container its sandbox services started, and no Docker
network created at any point.

Run with the project's Python (``.venv/bin/python deploy/compose/test.py``).  Exit status:
0 passed; 1 failed (the reason is the last line); 3 a prerequisite is missing (Docker,
docker-compose, or what the offline build needs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats.errors
from nats.aio.msg import Msg

from protocol import subjects
from protocol.client import StackUnavailable, TemperClient
from protocol.codec import Codec, encode
from protocol.messages import (
    ErrorReply,
    PolicyUpdate,
    SandboxExec,
    SandboxResult,
    SandboxStatus,
    ScoredRollout,
    StackStatus,
    Stats,
    Task,
)
from services.domains import load_registry
from services.domains.api import Domain

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "deploy" / "temper" / "build-offline.sh"
COMPOSE_FILES = ("docker-compose.yml", "deploy/compose/host.yml", "deploy/compose/test.yml")
SERVICES = ("control", "generator", "learner", "replay", "sandbox", "validator")
DOMAIN = "arithmetic"
EXIT_FAILED = 1
EXIT_PREREQ = 3
BUILD_TIMEOUT_S = 1800.0
COMPOSE_TIMEOUT_S = 300.0
HEALTHY_TIMEOUT_S = 240.0
UPDATE_TIMEOUT_S = 300.0
SCALED_TIMEOUT_S = 180.0
#: deploy/compose/test.yml checks every 10 s; a container started last needs one check.
DOCKER_HEALTH_TIMEOUT_S = 90.0
SANDBOX_LABEL = "temper.sandbox"
OWNER_LABEL = "temper.sandbox.owner"
PROJECT_LABEL = "com.docker.compose.project"
SCORED: Codec[ScoredRollout] = Codec(ScoredRollout)
UPDATES: Codec[PolicyUpdate] = Codec(PolicyUpdate)
STATS: Codec[Stats] = Codec(Stats)
SANDBOX_REPLIES: Codec[SandboxResult | ErrorReply] = Codec(SandboxResult | ErrorReply)


class Missing(Exception):
    """A prerequisite is missing: nothing was tested."""


class Failed(Exception):
    """The stack did not do what it should."""


_started = time.monotonic()


def say(line: str) -> None:
    print(f"[compose-test {time.monotonic() - _started:6.1f}s] {line}", flush=True)


def run(argv: list[str], *, timeout: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise Failed(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def docker_ids(*args: str) -> set[str]:
    return set(run(["docker", *args, "--quiet"], timeout=60).split())


# ---------------------------------------------------------------- prerequisites and build


def compose_command() -> list[str]:
    """Debian's docker-compose (1.x), else the v2 plugin."""
    if shutil.which("docker") is None:
        raise Missing("the docker CLI is not installed")
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        raise Missing("the Docker engine does not answer ('docker info' failed)")
    if shutil.which("docker-compose") is not None:
        return ["docker-compose"]
    plugin = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60)
    if plugin.returncode == 0:
        return ["docker", "compose"]
    raise Missing("neither docker-compose nor the docker compose plugin is installed")


def build_image() -> str:
    say("offline image: deploy/temper/build-offline.sh (cached by content hash)")
    started = time.monotonic()
    build = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )
    if build.returncode == EXIT_PREREQ:
        raise Missing(f"cannot build the image: {build.stderr.strip()[-500:]}")
    if build.returncode != 0:
        raise Failed(f"build-offline.sh exited {build.returncode}:\n{build.stderr[-3000:]}")
    tag = build.stdout.split()[-1]
    say(f"image {tag} ready in {time.monotonic() - started:.1f}s")
    return tag


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ---------------------------------------------------------------- the stack


@dataclass
class Stack:
    compose: list[str]
    project: str
    nats_port: int
    monitor_port: int
    #: ``<host>:<pid>`` of every sandbox service seen: the owner label of its containers.
    sandbox_owners: set[str] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    def command(self, *args: str) -> list[str]:
        files = [arg for name in COMPOSE_FILES for arg in ("-f", str(REPO / name))]
        return [*self.compose, "--project-name", self.project, *files, *args]

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "TEMPER_NATS_PORT": str(self.nats_port),
            "TEMPER_NATS_MONITOR_PORT": str(self.monitor_port),
        }

    def compose_run(self, *args: str) -> str:
        return run(self.command(*args), timeout=COMPOSE_TIMEOUT_S, env=self.env())

    def up(self, *scale: str) -> None:
        self.compose_run("up", "--detach", "--no-build", *scale)

    def down(self) -> None:
        self.compose_run("down", "--volumes", "--remove-orphans", "--timeout", "30")

    def logs(self, lines: int = 40) -> str:
        with contextlib.suppress(Failed, subprocess.TimeoutExpired):
            return self.compose_run("logs", "--no-color", "--tail", str(lines))
        return "(no logs)"

    def containers(self) -> set[str]:
        return docker_ids("ps", "--all", "--filter", f"label={PROJECT_LABEL}={self.project}")

    def volumes(self) -> set[str]:
        labelled = docker_ids("volume", "ls", "--filter", f"label={PROJECT_LABEL}={self.project}")
        named = {v for v in docker_ids("volume", "ls") if v.startswith(f"{self.project}_")}
        return labelled | named

    def networks(self) -> set[str]:
        return docker_ids("network", "ls", "--filter", f"label={PROJECT_LABEL}={self.project}")

    def sandboxes(self) -> set[str]:
        """Sandbox containers started by this stack's sandbox services."""
        found: set[str] = set()
        for owner in self.sandbox_owners:
            found |= docker_ids("ps", "--all", "--filter", f"label={OWNER_LABEL}={owner}")
        return found

    def health(self) -> dict[str, str]:
        """Each service container's Docker health (its `temper check` healthcheck)."""
        shape = "{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}"
        out = run(["docker", "inspect", "--format", shape, *sorted(self.containers())], timeout=60)
        names = (line.split() for line in out.splitlines())
        return {name.lstrip("/"): state for name, state in names if "model-init" not in name}

    def restarted(self) -> list[str]:
        """Service containers that exited or restarted (a crash the restart policy hid)."""
        shape = "{{.Name}} {{.RestartCount}} {{.State.Status}}"
        out = run(["docker", "inspect", "--format", shape, *sorted(self.containers())], timeout=60)
        bad = []
        for line in out.splitlines():
            name, count, state = line.split()
            if "model-init" not in name and (count != "0" or state != "running"):
                bad.append(f"{name.lstrip('/')} ({state}, restarted {count}x)")
        return bad


# ---------------------------------------------------------------- what the stack does


@dataclass
class Seen:
    scored: list[ScoredRollout] = field(default_factory=list)
    updates: list[PolicyUpdate] = field(default_factory=list)
    #: Each sandbox instance's last ``executed`` figure.
    executed: dict[str, float] = field(default_factory=dict)

    async def on_scored(self, msg: Msg) -> None:
        self.scored.append(SCORED.decode(msg.data))

    async def on_update(self, msg: Msg) -> None:
        self.updates.append(UPDATES.decode(msg.data))

    async def on_sandbox_stats(self, msg: Msg) -> None:
        stats = STATS.decode(msg.data)
        self.executed[stats.instance] = stats.values.get("executed", 0.0)

    def validators(self) -> set[str]:
        return {s.validator for s in self.scored}


@functools.cache
def domain() -> Domain:
    return load_registry(REPO / "deploy" / "domains").get(DOMAIN)


def tasks(count: int, seed: int) -> Iterator[Task]:
    for task in domain().make_tasks(count, split="train", seed=seed):
        fields = {name: getattr(task, name) for name in task.__struct_fields__ if name != "v"}
        # Groups of 4 give advantages; a random policy often runs to the token limit,
        # which the domain would keep out of the loss.
        yield Task(**{**fields, "n": 4, "metadata": {**task.metadata, "overlong": "keep"}})


async def connect(url: str, deadline: float) -> TemperClient:
    while True:
        try:
            return await TemperClient.connect(url, name="compose-test", connect_timeout_s=2)
        except StackUnavailable:
            if time.monotonic() > deadline:
                raise Failed(f"NATS at {url} never answered") from None
            await asyncio.sleep(1)


async def status(client: TemperClient) -> StackStatus | None:
    try:
        return await client.status(timeout_s=2)
    except (StackUnavailable, TimeoutError, nats.errors.Error):
        return None


def healthy_instances(state: StackStatus | None, service: str) -> set[str]:
    if state is None:
        return set()
    return {s.instance for s in state.services if s.service == service and s.healthy and not s.gone}


async def wait_healthy(client: TemperClient, counts: dict[str, int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        state = await status(client)
        have = {name: len(healthy_instances(state, name)) for name in counts}
        short = {name: n for name, n in have.items() if n < counts[name]}
        if not short:
            return
        if time.monotonic() > deadline:
            raise Failed(f"not healthy after {timeout_s:.0f}s (healthy instances: {short})")
        await asyncio.sleep(2)


async def submit_until(
    client: TemperClient,
    seen: Seen,
    done: Callable[[], bool],
    timeout_s: float,
    what: str,
    seed: int,
) -> int:
    """Submit a few tasks every 2 s until ``done()``; returns the next seed."""
    deadline = time.monotonic() + timeout_s
    last_report = 0.0
    while not done():
        if time.monotonic() > deadline:
            raise Failed(
                f"no {what} within {timeout_s:.0f}s: {len(seen.scored)} scored rollouts, "
                f"{len(seen.updates)} policy updates, validators {sorted(seen.validators())}"
            )
        await client.submit_many(list(tasks(4, seed)))
        seed += 1
        if time.monotonic() - last_report > 15:
            last_report = time.monotonic()
            say(f"  waiting for {what}: {len(seen.scored)} scored, {len(seen.updates)} updates")
        await asyncio.sleep(2)
    return seed


async def first_phase(client: TemperClient, seen: Seen) -> int:
    say("waiting for every service to answer healthy")
    await wait_healthy(client, dict.fromkeys(SERVICES, 1), HEALTHY_TIMEOUT_S)
    say("healthy; submitting arithmetic tasks until a policy update reaches the generator")

    def updated() -> bool:
        return bool(seen.updates) and any((s.rollout.policy_version or 0) >= 1 for s in seen.scored)

    seed = await submit_until(client, seen, updated, UPDATE_TIMEOUT_S, "policy update", 1)
    versions = sorted({s.rollout.policy_version or 0 for s in seen.scored})
    say(
        f"{len(seen.scored)} scored rollouts, policy versions {versions}; "
        f"update {seen.updates[0].version} at {seen.updates[0].uri}"
    )
    await check_metrics(client)
    return seed


async def check_metrics(client: TemperClient) -> None:
    beats = await client.ping(timeout_s=2)
    urls = {b.metrics_url for b in beats if b.metrics_url}
    if len(urls) < len(SERVICES):
        raise Failed(f"{len(urls)} /metrics endpoints among {len(beats)} heartbeats")
    bad = [u for u in urls if not u.startswith("http://127.0.0.1:")]
    if bad:
        raise Failed(f"metrics not on loopback: {bad}")
    url = sorted(urls)[0]
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
    if b"temper_up" not in body:
        raise Failed(f"{url} serves no temper_up")
    say(f"{len(urls)} /metrics endpoints on loopback, e.g. {url}")


def show_status(url: str) -> None:
    """What an operator sees: `temper status`, instances and /metrics URLs from heartbeats."""
    argv = [sys.executable, "-m", "services", "--nats-url", url, "status"]
    shown = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    for line in (shown.stdout + shown.stderr).splitlines():
        print(f"    {line}", flush=True)


async def note_sandbox_owners(stack: Stack, client: TemperClient) -> None:
    for beat in await client.ping(timeout_s=2):
        if beat.service == "sandbox" and beat.pid:
            stack.sandbox_owners.add(f"{beat.host}:{beat.pid}")


async def exercise_sandboxes(stack: Stack, client: TemperClient, seen: Seen) -> None:
    instances = healthy_instances(await status(client), "sandbox")
    deadline = time.monotonic() + SCALED_TIMEOUT_S
    while not all(seen.executed.get(i, 0) > 0 for i in instances):
        if time.monotonic() > deadline:
            raise Failed(f"sandbox instances {sorted(instances)} executed {seen.executed}")
        requests = [SandboxExec(id=uuid.uuid4().hex, code="print(6 * 7)") for _ in range(4)]
        replies = await asyncio.gather(
            *(client.nc.request(subjects.sandbox_exec(), encode(r), timeout=120) for r in requests)
        )
        for reply in replies:
            result = SANDBOX_REPLIES.decode(reply.data)
            if isinstance(result, ErrorReply):
                raise Failed(f"sandbox exec refused: {result.message}")
            if result.status != SandboxStatus.OK or result.stdout.strip() != "42":
                raise Failed(f"sandbox exec: {result.status} {result.stdout!r} {result.error}")
        await asyncio.sleep(1.5)  # a stats period
    say(f"both sandbox services executed code: {seen.executed}")
    if not stack.sandboxes():
        raise Failed(f"no sandbox container is owned by {sorted(stack.sandbox_owners)}")


async def second_phase(stack: Stack, client: TemperClient, seen: Seen, seed: int) -> None:
    say("scaling: --scale validator=2 --scale sandbox=2")
    await asyncio.to_thread(stack.up, "--scale", "validator=2", "--scale", "sandbox=2")
    await wait_healthy(client, {"validator": 2, "sandbox": 2}, SCALED_TIMEOUT_S)
    state = await status(client)
    validators = {f"validator/{i}" for i in healthy_instances(state, "validator")}
    say(f"two instances each: validators {sorted(validators)}")
    await asyncio.to_thread(show_status, stack.url)
    await note_sandbox_owners(stack, client)
    await exercise_sandboxes(stack, client, seen)

    def both_scored() -> bool:
        return validators <= seen.validators()

    await submit_until(client, seen, both_scored, SCALED_TIMEOUT_S, "scores by both", seed)
    per = {v: sum(s.validator == v for s in seen.scored) for v in sorted(validators)}
    say(f"both validators scored: {per}")


async def wait_docker_healthy(stack: Stack) -> None:
    deadline = time.monotonic() + DOCKER_HEALTH_TIMEOUT_S
    while True:
        health = await asyncio.to_thread(stack.health)
        if all(state == "healthy" for state in health.values()):
            say(f"Docker reports all {len(health)} service containers healthy (temper check)")
            return
        if time.monotonic() > deadline:
            raise Failed(f"Docker healthchecks (temper check) still failing: {health}")
        await asyncio.sleep(2)


async def exercise(stack: Stack) -> None:
    seen = Seen()
    client = await connect(stack.url, time.monotonic() + HEALTHY_TIMEOUT_S)
    async with client:
        await client.nc.subscribe(subjects.scored_all(), cb=seen.on_scored)
        await client.nc.subscribe(subjects.policy_update(), cb=seen.on_update)
        await client.nc.subscribe(subjects.stats("sandbox"), cb=seen.on_sandbox_stats)
        seed = await first_phase(client, seen)
        await note_sandbox_owners(stack, client)
        await second_phase(stack, client, seen, seed)
        await wait_docker_healthy(stack)


# ---------------------------------------------------------------- the whole run


def bring_down(stack: Stack, networks_before: set[str]) -> list[str]:
    """``down``, then what is left of the project (empty: nothing)."""
    say("down --volumes")
    stack.down()
    left = [f"container {c}" for c in stack.containers()]
    left += [f"volume {v}" for v in stack.volumes()]
    left += [f"network {n}" for n in stack.networks()]
    left += [f"network {n} (new)" for n in docker_ids("network", "ls") - networks_before]
    left += [f"sandbox container {c}" for c in stack.sandboxes()]
    return left


def remove_leftovers(stack: Stack) -> None:
    """After a failure: what ``down`` left, so that a failed run leaves no trace either."""
    for ids, argv in (
        (stack.containers() | stack.sandboxes(), ["docker", "rm", "--force"]),
        (stack.volumes(), ["docker", "volume", "rm", "--force"]),
    ):
        if ids:
            subprocess.run([*argv, *sorted(ids)], capture_output=True, timeout=120)


def check_stack(stack: Stack) -> None:
    networks_before = docker_ids("network", "ls")
    say(f"up: project {stack.project}, NATS at {stack.url}")
    passed = False
    try:
        stack.up()
        if stack.networks() or docker_ids("network", "ls") - networks_before:
            raise Failed("compose created a Docker network")
        asyncio.run(exercise(stack))
        crashed = stack.restarted()
        if crashed:
            raise Failed(f"containers crashed during the run: {crashed}")
        passed = True
    except BaseException:
        print(stack.logs(), file=sys.stderr)
        raise
    finally:
        try:
            left = bring_down(stack, networks_before)
        except (Failed, subprocess.TimeoutExpired):
            remove_leftovers(stack)
            raise
        if left:
            remove_leftovers(stack)
            if passed:
                raise Failed(f"down left: {', '.join(left)}")
    say("down left nothing: no container, volume, network or sandbox container")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", help="compose project name (default: a fresh one)")
    args = parser.parse_args(argv)
    try:
        compose = compose_command()
        say(f"compose: {' '.join(compose)}")
        build_image()
        nats_port = free_port()
        monitor_port = free_port()
        while monitor_port == nats_port:
            monitor_port = free_port()
        stack = Stack(
            compose=compose,
            project=args.project or f"tempertest{uuid.uuid4().hex[:8]}",
            nats_port=nats_port,
            monitor_port=monitor_port,
        )
        check_stack(stack)
    except Missing as error:
        print(f"compose-test: prerequisite missing: {error}", file=sys.stderr)
        return EXIT_PREREQ
    except (Failed, subprocess.TimeoutExpired) as error:
        print(f"compose-test: FAILED: {error}", file=sys.stderr)
        return EXIT_FAILED
    say("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
