"""``temper submit --wait`` at scale: one consumer follows a whole submission.

nats-server and the stack's JetStream streams are real, and the CLI runs as a user runs
it.  The scored rollouts are published by the test itself, on the real result subjects
(``temper.v1.scored.<domain>.<task_id>``) of the real ``TEMPER_SCORED`` stream: what is
under test is how the client consumes them (one consumer however many tasks, never the
server's limit on consumers per stream), so no generator or validator runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from protocol import streams, subjects
from protocol.client.submission import TASK_FILTERS_MAX
from protocol.codec import encode
from protocol.messages import ChatMessage, Rollout, ScoredRollout, Task
from services.runtime.jetstream import ensure_streams, stream_config
from tests.integration.support import client
from tests.integration.test_cli_harness import finish, start

pytestmark = pytest.mark.integration

TASKS = 10_000
DOMAINS = ("math", "code", "docs", "tools")
SUBMITTED = re.compile(r"^submitted (\S+) -> ")
SCORED = re.compile(r"^scored (\S+) reward=(\S+) status=scored$")


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    async with client(nats_url) as conn:
        yield conn


def task(task_id: str, domain: str, *, attempt: int = 0) -> Task:
    return Task(
        id=task_id,
        domain=domain,
        attempt=attempt,
        prompt=[ChatMessage(role="user", content=f"question {task_id}")],
    )


def make_tasks(count: int, prefix: str) -> list[Task]:
    return [task(f"{prefix}{i:05d}", DOMAINS[i % len(DOMAINS)]) for i in range(count)]


def write_jsonl(path: Path, tasks: list[Task]) -> Path:
    lines = (
        json.dumps({"id": t.id, "domain": t.domain, "prompt": t.prompt[0].content}) for t in tasks
    )
    path.write_text("\n".join(lines) + "\n")
    return path


def reward_of(task_id: str) -> float:
    return int(task_id[-4:]) % 7 / 8


def scored(of: Task) -> ScoredRollout:
    rollout = Rollout(id=f"{of.id}/0", task=of, sample_index=0)
    return ScoredRollout(id=rollout.id, rollout=rollout, reward=reward_of(of.id))


async def publish_results(nc: NATS, tasks: list[Task], batch: int = 500) -> None:
    """Each task's scored rollout on its real subject; core publishes, which the stream
    stores all the same, flushed in batches."""
    for first in range(0, len(tasks), batch):
        for one in tasks[first : first + batch]:
            await nc.publish(subjects.scored(one.domain, one.id), encode(scored(one)))
        await nc.flush()


async def wait_stored(js: JetStreamContext, count: int, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while (await js.stream_info(streams.SCORED.name)).state.messages < count:
            await asyncio.sleep(0.05)


@dataclass
class Output:
    """What the CLI printed on stdout so far, read as it comes (a full pipe would stall it)."""

    submitted: list[str] = field(default_factory=list)
    scored: dict[str, float] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)
    all_submitted: asyncio.Event = field(default_factory=asyncio.Event)


async def read_output(proc: asyncio.subprocess.Process, out: Output, expected: int) -> None:
    assert proc.stdout is not None
    while line := (await proc.stdout.readline()).decode():
        if match := SUBMITTED.match(line):
            out.submitted.append(match.group(1))
            if len(out.submitted) == expected:
                out.all_submitted.set()
        elif match := SCORED.match(line):
            assert match.group(1) not in out.scored, f"printed twice: {line}"
            out.scored[match.group(1)] = float(match.group(2))
        else:
            out.other.append(line)


async def ended(
    proc: asyncio.subprocess.Process, reader: asyncio.Task[None], timeout_s: float = 60.0
) -> tuple[int, str]:
    """Exit status and stderr once stdout is read to its end (the process killed past
    ``timeout_s``, failing the test with what it printed on stderr)."""
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(timeout_s):
            await reader
            err = (await proc.stderr.read()).decode()
            return await proc.wait(), err
    except TimeoutError:
        proc.kill()
        # Read both pipes to their end: a pipe whose reader stopped is paused once its
        # buffer is full, never sees EOF, and then ``wait()`` never returns (3.11).
        _, late = await proc.communicate()
        raise AssertionError(
            f"submit --wait did not end within {timeout_s:g}s; stderr:\n{late.decode()[-3000:]}"
        ) from None


async def most_consumers(js: JetStreamContext, seen: list[int]) -> None:
    """Record how many consumers ``TEMPER_SCORED`` has, as often as the server answers."""
    while True:
        seen.append((await js.stream_info(streams.SCORED.name)).state.consumer_count)
        await asyncio.sleep(0.02)


# Past the two 60 s waits inside, so a slow run fails there, naming the wait, not here.
@pytest.mark.timeout(180)
async def test_ten_thousand_tasks_are_waited_for_through_one_consumer(
    nats_url: str, nc: NATS, tmp_path: Path
) -> None:
    js = nc.jetstream()
    await ensure_streams(js, streams.ALL)
    tasks = make_tasks(TASKS, "s")
    # Results of other tasks in the same domains, before and during the wait: never printed.
    strangers = make_tasks(200, "x")
    await publish_results(nc, strangers[:100])
    path = write_jsonl(tmp_path / "tasks.jsonl", tasks)

    counts: list[int] = []
    output = Output()
    proc = await start(nats_url, "submit", str(path), "--wait", "--timeout", "120")
    async with asyncio.TaskGroup() as group:
        reader = group.create_task(read_output(proc, output, TASKS))
        watcher = group.create_task(most_consumers(js, counts))
        async with asyncio.timeout(60):
            await output.all_submitted.wait()
        await publish_results(nc, strangers[100:] + tasks)
        code, err = await ended(proc, reader)
        watcher.cancel()

    assert code == 0, err
    assert "Traceback" not in err
    assert sorted(output.submitted) == [t.id for t in tasks]
    assert output.scored == {scored(t).id: reward_of(t.id) for t in tasks}
    assert output.other == []
    # One consumer for the whole submission, and it is gone once the wait is over.
    assert max(counts) == 1, max(counts)
    info = await js.stream_info(streams.SCORED.name)
    assert info.state.consumer_count == 0


async def test_a_large_resubmission_finds_its_stored_results(
    nats_url: str, nc: NATS, tmp_path: Path
) -> None:
    # More tasks than a consumer filters by task id: followed by domain, from the duplicate
    # window before the submission, since the stream took them all as duplicates.
    js = nc.jetstream()
    await ensure_streams(js, streams.ALL)
    tasks = make_tasks(TASK_FILTERS_MAX + 50, "d")
    path = write_jsonl(tmp_path / "tasks.jsonl", tasks)
    first = await finish(await start(nats_url, "submit", str(path)), timeout_s=60)
    assert first.code == 0, first.err
    await publish_results(nc, tasks)
    await wait_stored(js, len(tasks))

    again = await finish(await start(nats_url, "submit", str(path), "--wait", "--timeout", "30"))
    assert again.code == 0, again.err
    receipts = [line for line in again.out.splitlines() if line.startswith("submitted ")]
    assert len(receipts) == len(tasks)
    assert all(line.endswith("(duplicate: already submitted)") for line in receipts)
    printed = {m.group(1) for m in map(SCORED.match, again.out.splitlines()) if m}
    assert printed == {scored(t).id for t in tasks}


async def test_a_stream_out_of_consumers_gets_an_error_naming_the_limit(
    nats_url: str, nc: NATS, tmp_path: Path
) -> None:
    js = nc.jetstream()
    await ensure_streams(js, [s for s in streams.ALL if s is not streams.SCORED])
    # The real stream, allowed a single consumer, which another client holds.
    await js.add_stream(replace(stream_config(streams.SCORED), max_consumers=1))
    other = await js.subscribe(subjects.scored_all(), stream=streams.SCORED.name)
    try:
        path = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(3, "c"))
        done = await finish(await start(nats_url, "submit", str(path), "--wait"))
    finally:
        with contextlib.suppress(Exception):
            await other.unsubscribe()
    assert done.code == 1
    assert "Traceback" not in done.err
    assert done.err.count("\n") == 1, done.err
    assert "TEMPER_SCORED has as many consumers as the NATS server allows" in done.err
    assert "max_consumers" in done.err
    assert "NATS error 10026" in done.err
