"""Exactly-once training, proven with ``kill -9``: replay and learner run as real processes
under the supervisor while scored rollouts keep arriving; the learner and the replay
buffer are killed mid-run, restarted by the supervisor, and the provenance ledger must
show every rollout trained exactly once, every one committed, none lost."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from protocol import subjects
from protocol.codec import encode
from services.learner.ledger_check import LedgerReport, check
from services.runtime.service import Service
from services.supervisor import Supervisor
from tests.integration.chaos import Stack, running_stack
from tests.integration.support import client
from tests.integration.test_supervisor import alive
from tests.unit.test_replay_buffer import scored

GROUPS = 120
#: Seconds between two published groups: the learner keeps working across the kills.
PACE_S = 0.15


def _env(model: Path, run_dir: Path) -> dict[str, str]:
    return {
        "TEMPER_LEARNER_MODEL": str(model),
        "TEMPER_LEARNER_OUT_DIR": str(run_dir / "learner"),
        "TEMPER_LEARNER_BATCH_SIZE": "8",
        "TEMPER_LEARNER_MIN_SAMPLES": "2",
        "TEMPER_LEARNER_SAMPLE_WAIT_S": "0.3",
        "TEMPER_LEARNER_CHECKPOINT_EVERY": "3",
        "TEMPER_LEARNER_TENSORBOARD": "false",
        "TEMPER_LEARNER_THREADS": "1",
        # Re-served rollouts are old by then: staleness must not drop them in this test.
        "TEMPER_REPLAY_MAX_STALENESS": "100000",
        "TEMPER_REPLAY_ACK_WAIT_S": "5",
        "TEMPER_STATS_S": "1",
    }


@pytest.fixture
async def stack(tmp_path: Path, tiny_model: Path) -> AsyncIterator[Stack]:
    env = _env(tiny_model, tmp_path)
    async with running_stack(tmp_path, env, services=("replay", "learner")) as running:
        yield running


async def _publish_all(url: str) -> set[str]:
    ids: set[str] = set()
    async with client(url) as nc:
        js = nc.jetstream()
        for group in range(GROUPS):
            for index in (0, 1):
                item = scored(f"g{group}", index)
                subject = subjects.scored(item.rollout.task.domain, item.rollout.task.id)
                headers = {"Nats-Msg-Id": item.id, "Temper-Trace-Id": f"trace-{item.id}"}
                await js.publish(subject, encode(item), headers=headers)
                ids.add(item.id)
            await asyncio.sleep(PACE_S)
    return ids


def _ledger_traces(path: Path) -> dict[str, str]:
    traces: dict[str, str] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        for rollout in record.get("rollouts", []):
            traces[rollout["id"]] = rollout["trace"]
    return traces


def _ledger(run_dir: Path) -> Path:
    return run_dir / "learner" / "ledger.jsonl"


def _steps(run_dir: Path) -> int:
    path = _ledger(run_dir)
    return path.read_text().count('"kind":"step"') if path.exists() else 0


async def _kill_after_steps(supervisor: Supervisor, name: str, run_dir: Path, more: int) -> None:
    """Wait until the learner recorded ``more`` steps after now, then kill -9 ``name``."""
    target = _steps(run_dir) + more
    async with asyncio.timeout(60):
        while _steps(run_dir) < target:
            await asyncio.sleep(0.05)
    proc = supervisor.children[name].proc
    assert proc is not None and alive(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    async with asyncio.timeout(30):
        while supervisor.children[name].proc is proc:  # replaced once restarted
            await asyncio.sleep(0.05)


async def _until_trained(run_dir: Path, wanted: set[str]) -> LedgerReport:
    async with asyncio.timeout(90):
        while True:
            if _ledger(run_dir).exists():
                report = check(_ledger(run_dir))
                if report.trained_ids >= wanted:
                    return report
            await asyncio.sleep(0.5)


async def test_killed_learner_and_replay_train_every_rollout_exactly_once(
    stack: Stack, tmp_path: Path
) -> None:
    supervisor = stack.supervisor
    async with asyncio.TaskGroup() as group:
        published = group.create_task(_publish_all(supervisor.nats_url))
        await _kill_after_steps(supervisor, "learner", tmp_path, 4)
        await _kill_after_steps(supervisor, "replay", tmp_path, 4)
        await _kill_after_steps(supervisor, "learner", tmp_path, 4)
    wanted = published.result()
    await _until_trained(tmp_path, wanted)
    # A clean stop checkpoints and commits everything the learner trained.
    await stack.shutdown()
    report = check(_ledger(tmp_path))
    assert report.trained_ids == wanted
    assert report.trained_twice == [] and report.lost == [] and report.version_errors == []
    assert report.uncommitted == [], "a clean stop commits everything trained"
    assert report.resumes >= 2, report.summary()
    traces = _ledger_traces(_ledger(tmp_path))
    assert all(traces[i] == f"trace-{i}" for i in wanted), "each rollout's trace id is kept"
    children = supervisor.children
    assert children["learner"].restarts == 2 and children["replay"].restarts == 1


async def test_a_resumed_learner_commits_what_its_checkpoint_covers_before_releasing(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    """Rollouts trained before the checkpoint and not yet committed (commits trail one
    checkpoint) are committed at start, not served again to be dropped as stale."""
    from services.learner.service import LearnerService
    from services.learner.settings import LearnerSettings, SamplingSettings
    from services.learner.trainer import Trainer
    from services.replay.service import ReplayService, ReplaySettings
    from tests.integration.support import runtime
    from tests.integration.test_replay_service import _publish, _sample, _until_held

    learner_settings = LearnerSettings(
        runtime=runtime(nats_url, instance="lrn-resume"),
        model=tiny_model,
        out_dir=tmp_path / "learner",
        tensorboard=False,
        sampling=SamplingSettings(sample_wait_s=0.2),
    )
    replay_settings = ReplaySettings(runtime=runtime(nats_url, instance="replay-resume"))
    async with client(nats_url) as nc, ReplayService(replay_settings) as replay:
        trained = [scored("t", 0), scored("t", 1)]
        after = [scored("u", 0), scored("u", 1)]
        await _publish(nc, [*trained, *after])
        await _until_held(replay, 4)
        await _sample(nc, lease=True, max_samples=2, whole_groups=True, id="old-1")
        await _sample(nc, lease=True, max_samples=2, whole_groups=True, id="old-2")
        assert replay.buffer.leased == 4
        ids = [item.id for item in trained]
        checkpointed = Trainer(
            tiny_model, learner_settings.out_dir, learner_settings.trainer_config()
        )
        checkpointed.save_checkpoint({"ledger": {"position": 0, "recent": ids, "uncommitted": ids}})
        async with LearnerService(learner_settings):
            stats = replay.buffer.statistics()
            assert stats["committed"] >= 2, "the checkpoint's rollouts are committed at start"
            assert stats["released"] == 2, "only the abandoned steps' rollouts come back"


async def test_a_batch_whose_reply_is_lost_is_released_and_trained_once(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    """The buffer leased a batch, but its reply never reached the learner (dropped here
    at the transport): the learner releases the lease, and the rollouts are served
    again and trained once."""
    from services.learner.service import LearnerService
    from services.learner.settings import LearnerSettings, SamplingSettings
    from services.replay.service import ReplayService, ReplaySettings
    from tests.integration.support import runtime
    from tests.integration.test_replay_service import _publish, _until_held

    settings = LearnerSettings(
        runtime=runtime(nats_url, instance="lrn-lost"),
        model=tiny_model,
        out_dir=tmp_path / "learner",
        tensorboard=False,
        sampling=SamplingSettings(sample_wait_s=0.2, min_samples=2),
    )
    replay_settings = ReplaySettings(runtime=runtime(nats_url, instance="replay-lost"))
    wanted = {"lost/0", "lost/1"}
    async with client(nats_url) as nc, ReplayService(replay_settings) as replay:
        await _publish(nc, [scored("lost", 0), scored("lost", 1)])
        await _until_held(replay, 2)
        learner = LearnerService(settings)
        await learner.start()
        try:
            await _lose_one_reply(learner)
            async with asyncio.timeout(30):
                while not (_ledger(tmp_path).exists() and check(_ledger(tmp_path)).trained_ids):
                    await asyncio.sleep(0.1)
        finally:
            await learner.stop()
    report = check(_ledger(tmp_path))
    assert report.trained_ids == wanted and report.ok, report.summary()
    assert replay.buffer.statistics()["released"] >= 2


async def _lose_one_reply(learner: Service) -> None:
    """Let the next sample request reach the buffer, then drop its reply."""
    nc = learner.bus.nc
    real = nc.request
    lost = asyncio.Event()

    async def request(subject: str, payload: bytes = b"", *args: Any, **kw: Any) -> Any:
        reply = await real(subject, payload, *args, **kw)
        if subject == subjects.replay_sample() and not lost.is_set() and b"lost/0" in reply.data:
            lost.set()
            raise nats.errors.TimeoutError
        return reply

    nc.request = request  # type: ignore[method-assign]
    async with asyncio.timeout(30):
        await lost.wait()


async def test_the_learner_stops_at_max_steps_with_everything_trained_committed(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    """``max_steps`` = 2, batches of 4 and 12 rollouts waiting: two steps, their rollouts
    committed (not left leased), the rest left in the buffer for whoever comes next."""
    from services.learner.service import LearnerService
    from services.learner.settings import CommitSettings, LearnerSettings, SamplingSettings
    from services.replay.service import ReplayService, ReplaySettings
    from tests.integration.support import runtime
    from tests.integration.test_replay_service import _publish, _until_held

    settings = LearnerSettings(
        runtime=runtime(nats_url, instance="lrn-max"),
        model=tiny_model,
        out_dir=tmp_path / "learner",
        tensorboard=False,
        sampling=SamplingSettings(batch_size=4, sample_wait_s=0.2, min_samples=4, max_steps=2),
        commits=CommitSettings(checkpoint_every=10),
    )
    replay_settings = ReplaySettings(runtime=runtime(nats_url, instance="replay-max"))
    items = [scored(f"max{g}", i) for g in range(6) for i in (0, 1)]
    async with client(nats_url) as nc, ReplayService(replay_settings) as replay:
        await _publish(nc, items)
        await _until_held(replay, len(items))
        async with LearnerService(settings) as learner:
            async with asyncio.timeout(60):
                while not (_ledger(tmp_path).exists() and check(_ledger(tmp_path)).steps >= 2):
                    await asyncio.sleep(0.1)
                while replay.buffer.statistics()["leased"]:
                    await asyncio.sleep(0.1)
            await asyncio.sleep(1.5)  # a third step would come now, were it allowed
            steps = learner.trainer.step
        held = replay.buffer.statistics()["held"]
    report = check(_ledger(tmp_path))
    assert steps == 2 and report.steps == 2, report.summary()
    assert len(report.trained_ids) == 8 and report.uncommitted == [] and report.ok
    assert held == len(items) - 8
