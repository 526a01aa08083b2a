"""``temper submit``: task files with shorthands, bad lines, duplicates, no stack, ``--wait``."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from protocol import headers as h
from protocol import streams, subjects
from protocol.codec import Codec, encode
from protocol.messages import DEFAULT_TIER, ChatMessage, Rollout, ScoredRollout, Task
from protocol.packed import pack_i32
from services.runtime.jetstream import ensure_streams
from services.runtime.natsserver import NatsServer
from tests.integration.support import client, stream_entries
from tests.integration.test_cli_harness import finish, free_port, start, temper

TASKS = Codec(Task)
SUBMITTED = re.compile(r"^submitted (\S+) -> (\S+) #(\d+) trace ([0-9a-f]{32})(.*)$", re.MULTILINE)


@pytest.fixture
async def js(nats_url: str) -> AsyncIterator[JetStreamContext]:
    async with client(nats_url) as nc:
        await ensure_streams(nc.jetstream(), streams.ALL)
        yield nc.jetstream()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text(text)
    return path


async def all_tasks(js: JetStreamContext) -> list[tuple[Task, dict[str, str]]]:
    out = []
    for spec in streams.TASK_STREAMS:
        for entry in await stream_entries(js, spec.name):
            out.append((TASKS.decode(entry.data), dict(entry.headers or {})))
    return out


def scored(task: Task, index: int, reward: float = 1.0) -> ScoredRollout:
    rollout = Rollout(id=f"{task.id}-r{index}", task=task, sample_index=index)
    return ScoredRollout(id=f"{task.id}-s{index}", rollout=rollout, reward=reward)


async def publish_scored(js: JetStreamContext, result: ScoredRollout) -> None:
    task = result.rollout.task
    await js.publish(subjects.scored(task.domain, task.id), encode(result))


async def test_shorthands_are_accepted_and_land_in_the_task_streams(
    nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        '# two tasks\n{"domain": "math", "prompt": "2 + 2?"}\n\n'
        '{"id": "tok-1", "domain": "code", "tier": 0, "prompt_tokens": [1, 2, 3], "n": 4}\n',
    )
    done = await temper(nats_url, "submit", str(path))
    assert done.code == 0, done.err
    lines = SUBMITTED.findall(done.out)
    assert len(lines) == 2
    (first_id, first_stream, _, first_trace, first_note), second = lines
    assert first_stream == streams.task_stream_name(DEFAULT_TIER)
    assert re.fullmatch(r"[0-9a-f]{32}", first_id)
    assert second[:2] == ("tok-1", streams.task_stream_name(0))
    assert first_note == second[4] == ""

    stored = {task.id: (task, hdrs) for task, hdrs in await all_tasks(js)}
    assert sorted(stored) == sorted([first_id, "tok-1"])
    task, hdrs = stored[first_id]
    assert task.prompt == [ChatMessage(role="user", content="2 + 2?")]
    assert (task.domain, task.tier) == ("math", DEFAULT_TIER)
    assert hdrs[h.TRACE_ID] == first_trace
    assert hdrs[h.MSG_ID] == f"task:{first_id}:0"
    tokens, hdrs = stored["tok-1"]
    assert (tokens.prompt_tokens, tokens.n, tokens.prompt) == (pack_i32([1, 2, 3]), 4, [])
    assert hdrs[h.TRACE_ID] == second[3]


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"domain": "math", "prompt": ', ["line 3: not JSON"]),
        (
            '{"domain": "math", "prompt": "x", "sampling": {"temperature": -1}}',
            ["line 3: invalid task", "$.sampling.temperature"],
        ),
        (
            '{"domain": "math", "prompt_tokens": [1, 4294967296]}',
            ["line 3: invalid task", "$.prompt_tokens[1]"],
        ),
    ],
)
async def test_a_bad_line_fails_the_whole_file_and_publishes_nothing(
    nats_url: str, js: JetStreamContext, tmp_path: Path, bad_line: str, expected: list[str]
) -> None:
    good = '{"domain": "math", "prompt": "fine"}\n'
    path = write(tmp_path, f"{good}{good}{bad_line}\n{good}")
    done = await temper(nats_url, "submit", str(path))
    assert done.code == 2
    for part in expected:
        assert part in done.err
    assert "Traceback" not in done.err
    assert done.out == ""
    assert await all_tasks(js) == []


async def test_resubmitting_a_task_id_is_a_duplicate(
    nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    path = write(tmp_path, '{"id": "dup-1", "domain": "math", "prompt": "once"}\n')
    first = await temper(nats_url, "submit", str(path))
    assert first.code == 0, first.err
    assert "duplicate" not in first.out
    second = await temper(nats_url, "submit", str(path))
    assert second.code == 0, second.err
    [line] = SUBMITTED.findall(second.out)
    assert line[0] == "dup-1"
    assert "duplicate" in line[4]
    assert [task.id for task, _ in await all_tasks(js)] == ["dup-1"]


async def test_submit_from_standard_input(nats_url: str, js: JetStreamContext) -> None:
    proc = await start(nats_url, "submit", "-", stdin=asyncio.subprocess.PIPE)
    done = await finish(proc, stdin=b'{"id": "in-1", "domain": "math", "prompt": "x"}\n')
    assert done.code == 0, done.err
    assert "submitted in-1" in done.out
    assert [task.id for task, _ in await all_tasks(js)] == ["in-1"]


async def test_submit_with_no_stack_fails_clearly(tmp_path: Path) -> None:
    path = write(tmp_path, '{"domain": "math", "prompt": "x"}\n')
    url = f"nats://127.0.0.1:{free_port()}"
    done = await temper(url, "submit", str(path))
    assert done.code == 1
    assert done.err.startswith(f"temper: cannot reach NATS at {url}")
    assert "temper up" in done.err
    assert "Traceback" not in done.err
    assert done.err.count("cannot reach NATS") == 1


async def test_submit_with_nats_but_no_streams_fails_clearly(nats_url: str, tmp_path: Path) -> None:
    path = write(tmp_path, '{"domain": "math", "prompt": "x"}\n')
    done = await temper(nats_url, "submit", str(path))
    assert done.code == 1
    assert "no task stream captures" in done.err
    assert "Traceback" not in done.err


async def wait_submitted(proc: asyncio.subprocess.Process, count: int) -> list[str]:
    """Read stdout until ``count`` "submitted" lines arrived; returns the task ids."""
    assert proc.stdout is not None
    ids: list[str] = []
    async with asyncio.timeout(20):
        while len(ids) < count:
            line = (await proc.stdout.readline()).decode()
            assert line, "submit ended before printing every receipt"
            match = SUBMITTED.match(line)
            if match:
                ids.append(match.group(1))
    return ids


async def test_wait_returns_once_the_tasks_are_scored(
    nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    task = Task(id="w-1", domain="math", prompt=[ChatMessage(role="user", content="x")], n=2)
    other = Task(id="w-other", domain="math", prompt=[ChatMessage(role="user", content="y")])
    path = write(tmp_path, '{"id": "w-1", "domain": "math", "prompt": "x", "n": 2}\n')
    proc = await start(nats_url, "submit", str(path), "--wait", "--timeout", "20")
    try:
        assert await wait_submitted(proc, 1) == ["w-1"]
        # Another task's results must not count (they would complete n=2 on their own).
        await publish_scored(js, scored(other, 0))
        await publish_scored(js, scored(other, 1))
        await publish_scored(js, scored(task, 0, reward=0.25))
        await publish_scored(js, scored(task, 0, reward=0.5))  # scored twice: counted once
        await publish_scored(js, scored(task, 1))
    finally:
        done = await finish(proc)
    assert done.code == 0, done.err
    assert sorted(done.out.splitlines()) == [
        "scored w-1-s0 reward=0.2500 status=scored",
        "scored w-1-s1 reward=1.0000 status=scored",
    ]


async def test_wait_counts_results_stored_before_the_call(
    nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    task = Task(id="w-2", domain="math", prompt=[ChatMessage(role="user", content="x")])
    await publish_scored(js, scored(task, 0))
    path = write(tmp_path, '{"id": "w-2", "domain": "math", "prompt": "x"}\n')
    done = await temper(nats_url, "submit", str(path), "--wait", "--timeout", "10")
    assert done.code == 0, done.err
    assert "scored w-2-s0 reward=1.0000" in done.out


async def test_wait_times_out_with_a_message(
    nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    path = write(tmp_path, '{"id": "w-3", "domain": "math", "prompt": "x", "n": 3}\n')
    done = await temper(nats_url, "submit", str(path), "--wait", "--timeout", "0.5")
    assert done.code == 1
    assert "submitted w-3" in done.out
    assert "0 of 3 scored rollouts of task 'w-3'" in done.err
    assert "Traceback" not in done.err


async def wait_following(js: JetStreamContext, timeout_s: float = 20.0) -> None:
    """Wait until someone follows the scored stream (``--wait`` has made its consumer)."""
    async with asyncio.timeout(timeout_s):
        while (await js.stream_info(streams.SCORED.name)).state.consumer_count == 0:
            await asyncio.sleep(0.05)


async def test_wait_rides_through_a_nats_server_restart(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    task = Task(id="w-4", domain="math", prompt=[ChatMessage(role="user", content="x")], n=2)
    path = write(tmp_path, '{"id": "w-4", "domain": "math", "prompt": "x", "n": 2}\n')
    # Well under the 10 s after which nats-py itself would notice the consumer is gone.
    argv = ["submit", str(path), "--wait", "--timeout", "8", "--reconnect-timeout", "15"]
    proc = await start(nats_server.url, *argv)
    try:
        assert await wait_submitted(proc, 1) == ["w-4"]
        await publish_scored(js, scored(task, 0))
        await wait_following(js)
        nats_server.kill()
        await asyncio.sleep(1.0)
        await nats_server.start_async()
        await publish_scored(js, scored(task, 1))
    finally:
        done = await finish(proc)
    assert done.code == 0, done.err
    assert done.err == ""
    assert sorted(done.out.splitlines()) == [
        "scored w-4-s0 reward=1.0000 status=scored",
        "scored w-4-s1 reward=1.0000 status=scored",
    ]


async def test_wait_gives_up_in_one_line_when_nats_stays_away(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    url = nats_server.url
    path = write(tmp_path, '{"id": "w-5", "domain": "math", "prompt": "x"}\n')
    argv = ["submit", str(path), "--wait", "--timeout", "60", "--reconnect-timeout", "1"]
    proc = await start(url, *argv)
    try:
        assert await wait_submitted(proc, 1) == ["w-5"]
        await wait_following(js)
        nats_server.kill()
        killed_at = time.monotonic()
    finally:
        done = await finish(proc, timeout_s=20)
    took = time.monotonic() - killed_at
    assert done.code == 1
    assert done.err == f"temper: NATS at {url} unreachable for 1s; start the stack (`temper up`)\n"
    assert took < 5.0, took
