"""The kill suite: a ``temper train``-style stack works through a fixed set of tasks while
services, the learner and the replay buffer included, and nats-server itself, are killed
with ``kill -9`` at random moments; a generator is killed in the middle of a weight
update.  The supervisor restarts each.  At the end every task is scored, every rollout
trained exactly once (by the ledger), versions never reused, every generator on the
learner's version, and no process left."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path

import pytest

from protocol import subjects
from protocol.codec import Codec
from protocol.messages import PolicyUpdate, Task
from services.learner.ledger_check import check
from tests.integration.chaos import (
    GROUP,
    Stack,
    connected,
    generator_versions,
    make_tasks,
    policy_updates,
    running_stack,
    scored,
    stack_env,
    submit,
)

TASKS = 160
#: Tasks arrive in chunks through the kills, so every service has work when it dies.
CHUNKS = 12
CHUNK_EVERY_S = 5.0
KILLS = 22
#: The kill plan before shuffling: every kind of process, several times.
PLAN = (
    ["learner"] * 4
    + ["replay"] * 3
    + ["generator"] * 3
    + ["validator"] * 3
    + ["control"] * 2
    + ["nats-server"]
)
pytestmark = pytest.mark.timeout(600)
SEED = int(os.environ.get("TEMPER_CHAOS_SEED", "20261202"))


async def _kill(stack: Stack, name: str, log: list[str], ledger: Path) -> None:
    training = name == "learner" and await _until_training(ledger)
    if name == "nats-server":
        pid = stack.supervisor.nats_pid
        assert pid is not None
        stack.pids.add(pid)
    else:
        pid = await stack.running_pid(name)
    os.kill(pid, signal.SIGKILL)
    log.append(f"kill -9 {name} ({pid}){' while training' if training else ''}")


def _steps(ledger: Path) -> int:
    return ledger.read_text().count('"kind":"step"') if ledger.exists() else 0


async def _until_training(ledger: Path, wait_s: float = 30.0) -> bool:
    """A learner is killed mid-run, not only while it loads: wait for its next step
    (False when none came: the work may all be done)."""
    target = _steps(ledger) + 1
    try:
        async with asyncio.timeout(wait_s):
            while _steps(ledger) < target:
                await asyncio.sleep(0.05)
    except TimeoutError:
        return False
    return True


async def _kill_generator_mid_update(stack: Stack, log: list[str]) -> None:
    """Kill the generator as soon as a new version is announced: it is loading it then."""
    codec: Codec[PolicyUpdate] = Codec(PolicyUpdate)
    async with connected(stack.url) as nc:
        sub = await nc.subscribe(subjects.policy_update())
        update = codec.decode((await sub.next_msg(timeout=120)).data)
        pid = await stack.running_pid("generator")
        os.kill(pid, signal.SIGKILL)
        await sub.unsubscribe()
    log.append(f"kill -9 generator ({pid}) while loading v{update.version}")


async def _rampage(stack: Stack, rng: random.Random, log: list[str], ledger: Path) -> None:
    plan = PLAN + rng.choices(
        ["generator", "validator", "replay", "learner"], k=KILLS - len(PLAN) - 1
    )
    rng.shuffle(plan)
    middle = len(plan) // 2
    for index, name in enumerate(plan):
        await asyncio.sleep(rng.uniform(1.0, 3.5))
        if index == middle:
            await _kill_generator_mid_update(stack, log)
        await _kill(stack, name, log, ledger)


async def _feed(stack: Stack, tasks: list[Task]) -> None:
    size = -(-len(tasks) // CHUNKS)
    for start in range(0, len(tasks), size):
        async with connected(stack.url) as nc:
            await submit(nc, tasks[start : start + size])
        await asyncio.sleep(CHUNK_EVERY_S)


async def _until_done(stack: Stack, run_dir: Path, rollouts: int, timeout_s: float) -> None:
    """Every rollout scored, and every trainable one in the ledger."""
    ledger = run_dir / "learner" / "ledger.jsonl"
    async with asyncio.timeout(timeout_s):
        while True:
            await asyncio.sleep(2.0)
            found = await scored(stack.url)
            if len(found.ids) < rollouts or not ledger.exists():
                continue
            if check(ledger).trained_ids >= found.trainable:
                return


async def test_twenty_kills_lose_nothing_and_train_nothing_twice(
    tmp_path: Path, tiny_model: Path
) -> None:
    rng = random.Random(SEED)
    tasks = make_tasks(TASKS, seed=SEED)
    log: list[str] = []
    ledger = tmp_path / "learner" / "ledger.jsonl"
    async with running_stack(tmp_path, stack_env(tiny_model, tmp_path)) as stack:
        async with asyncio.TaskGroup() as group:
            group.create_task(_feed(stack, tasks))
            group.create_task(_rampage(stack, rng, log, ledger))
        assert len(log) >= 20, log
        try:
            await _until_done(stack, tmp_path, TASKS * GROUP, timeout_s=240)
        except TimeoutError:
            raise AssertionError(f"not done; kills: {log}; supervisor: {stack.lines}") from None
        found = await scored(stack.url)
        updates = await policy_updates(stack.url)
        final = updates[-1].version
        versions = await _until_generators_on(stack, final)
        await stack.shutdown()
        left = stack.left()
    assert len(found.ids) == TASKS * GROUP, "every task scored, every sample"
    report = check(tmp_path / "learner" / "ledger.jsonl")
    assert report.trained_twice == [] and report.lost == [], report.summary()
    assert report.uncommitted == [], report.summary()
    assert report.trained_ids == found.trainable, "none lost: every trainable rollout trained"
    assert report.version_errors == []
    _assert_versions_never_reused(updates)
    assert versions and set(versions.values()) == {float(final)}, versions
    killed = sum(1 for line in log if line.endswith("while training"))
    assert report.resumes >= killed, f"each kill of a training learner resumed: {report.summary()}"
    assert left == [], f"processes left: {left}"


async def _until_generators_on(stack: Stack, version: int) -> dict[str, float]:
    async with asyncio.timeout(60):
        while True:
            versions = await generator_versions(stack.url)
            if versions and all(v == version for v in versions.values()):
                return versions
            await asyncio.sleep(1.0)


def _assert_versions_never_reused(updates: list[PolicyUpdate]) -> None:
    """Announced versions never go back, and a number always names the same weights."""
    digests: dict[int, str] = {}
    last = -1
    for update in updates:
        assert update.version >= last, f"v{update.version} announced after v{last}"
        last = update.version
        assert digests.setdefault(update.version, update.digest) == update.digest, update
