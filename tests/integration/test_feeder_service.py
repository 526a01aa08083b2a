"""The feeder against a real nats-server: the mix within its bounds, groups scored back
into pools and filter counts that survive a restart, and a cursor that neither repeats
nor skips a problem when the process is killed with SIGKILL again and again."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import signal
from collections import Counter
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.messages import DEFAULT_TIER, Task
from protocol.streams import task_stream_name
from services.domains import load_registry
from services.domains.api import Problem
from services.feeder.dataset import Dataset
from services.feeder.service import FeederService
from services.feeder.settings import FeederSettings
from services.runtime.jetstream import ensure_streams
from tests.factories import publish_scored, scored
from tests.integration.support import client, runtime, serve, stream_entries

TASKS = Codec(Task)
STREAM = task_stream_name(DEFAULT_TIER)


def feeder(nats_url: str, state_dir: Path, instance: str = "f") -> FeederService:
    return FeederService(
        FeederSettings(
            runtime=runtime(nats_url, instance=instance),
            mix=("arithmetic_sum4=3", "arithmetic=1"),
            in_flight=8,
            group=2,
            dataset_size=40,
            state_dir=state_dir,
            top_up_s=0.05,
        )
    )


async def published(js: JetStreamContext) -> list[Task]:
    return [TASKS.decode(entry.data) for entry in await stream_entries(js, STREAM)]


async def wait_published(js: JetStreamContext, count: int) -> list[Task]:
    async with asyncio.timeout(20):
        while len(tasks := await published(js)) < count:
            await asyncio.sleep(0.05)
    return tasks


async def test_the_mix_stays_in_bounds_and_scored_groups_fill_the_pools(
    nats_url: str, tmp_path: Path
) -> None:
    async with client(nats_url) as nc:
        js = nc.jetstream()
        async with feeder(nats_url, tmp_path / "feeder") as service:
            tasks = await wait_published(js, 8)
            assert len({t.id for t in tasks}) == 8 and all(t.n == 2 for t in tasks)
            # 8 in flight, the small domain bound to ceil(1.5 * 8 / 4) = 3 of them.
            assert Counter(t.domain for t in tasks)["arithmetic"] <= 3
            easy, normal, hard = tasks[:3]
            for task, rewards in ((easy, (1.0, 1.0)), (normal, (1.0, 0.0)), (hard, (0.0, 0.0))):
                for index, reward in enumerate(rewards):
                    await publish_scored(js, scored(task, index, reward))
            await publish_scored(js, scored(easy, 0, 1.0))  # a redelivery counts once
            tasks = await wait_published(js, 11)
            assert len(tasks) == 11 and len(service.progress.open) == 8
            figures = service.statistics()
            pools = {
                pool: sum(figures[f"domain.{d}.pool_{pool}"] for d in service.weights)
                for pool in ("easy", "normal", "hard")
            }
            assert (pools["easy"], pools["hard"]) == (1, 1)
            assert sum(figures[f"domain.{d}.filtered"] for d in service.weights) == 2
            assert sum(figures[f"domain.{d}.done"] for d in service.weights) == 3
            # What `temper status` shows for the feeder.
            assert "arithmetic_sum4: drawn" in service.health()[1]
        # A restarted feeder has the same pools, counts and open tasks: it publishes nothing
        # more until a group is done.
        async with feeder(nats_url, tmp_path / "feeder", instance="g") as again:
            for name in again.weights:
                for key in ("pool_easy", "pool_hard", "filtered", "done", "drawn"):
                    figure = f"domain.{name}.{key}"
                    assert again.statistics()[figure] == figures[figure], figure
            await again.top_up()
            assert len(await published(js)) == 11


async def test_a_publish_that_fails_moves_no_cursor(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cursor is saved only once the stream has the task: a failed publish leaves the
    saved state as it was, so the problem is published on the next try, not skipped."""
    service = feeder(nats_url, tmp_path)
    service.settings = dataclasses.replace(service.settings, top_up_s=3600)  # top up by hand
    async with service:
        await service.top_up()
        saved = service.store.path.read_bytes()
        cursors = {n: service.progress.domain(n).cursor for n in service.weights}
        service.progress.open.clear()

        async def refused(*_: object, **__: object) -> None:
            raise RuntimeError("stream unavailable")

        monkeypatch.setattr(service.bus, "publish", refused)
        with pytest.raises(RuntimeError, match="stream unavailable"):
            await service.top_up()
        assert service.store.path.read_bytes() == saved
        assert {n: service.progress.domain(n).cursor for n in service.weights} == cursors


class Broken:
    """A task source whose generator raises, as a buggy plugin's would."""

    def draw(self, rng: random.Random) -> Problem:
        raise RuntimeError("generator bug")


async def test_a_domain_whose_generator_fails_is_quarantined_and_the_rest_go_on(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = load_registry(None)
    broken = dataclasses.replace(registry.get("arithmetic_sum4"), source=Broken())
    monkeypatch.setattr(registry, "_domains", {**registry._domains, broken.name: broken})
    monkeypatch.setattr("services.feeder.service.load_registry", lambda _: registry)
    settings = FeederSettings(
        runtime=runtime(nats_url),
        mix=("arithmetic", "arithmetic_sum4"),
        in_flight=4,
        state_dir=tmp_path,
        top_up_s=0.05,
    )
    async with client(nats_url) as nc, FeederService(settings) as service:
        tasks = await wait_published(nc.jetstream(), 4)
        assert {t.domain for t in tasks} == {"arithmetic"}
        assert set(service.quarantined) == {"arithmetic_sum4"}
        assert "generator bug" in service.health()[1]
        assert service.statistics()["quarantined"] == 1


@pytest.mark.timeout(240)
async def test_kill_9_at_any_moment_neither_repeats_nor_skips_a_problem(
    nats_url: str, tmp_path: Path
) -> None:
    """A feeder process killed five times, each time the instant one of its tasks arrives
    (it has the stream's ack, and may not have saved its cursor yet), while a scorer
    answers every task: each problem of the first two epochs is published exactly once."""
    domain = load_registry(None).get("arithmetic_sum4")
    dataset = Dataset.of(domain, 30, seed=0)
    env = {
        **os.environ,
        "TEMPER_NATS_URL": nats_url,
        "TEMPER_FEEDER_MIX": "arithmetic_sum4",
        "TEMPER_FEEDER_DATASET_SIZE": "30",
        "TEMPER_FEEDER_IN_FLIGHT": "3",
        "TEMPER_FEEDER_GROUP": "1",
        "TEMPER_FEEDER_STATE_DIR": str(tmp_path / "state"),
        "TEMPER_FEEDER_TOP_UP_S": "0.01",
        # Every sample passes, so every problem turns easy: take easy ones every time,
        # or the second epoch would pass most of them over.
        "TEMPER_FEEDER_EASY_TAKE": "1",
        # What a killed feeder had taken but not acked comes back to the next one soon.
        "TEMPER_FEEDER_ACK_WAIT_S": "1",
    }
    scorer = Scorer()
    async with client(nats_url) as nc:
        js = nc.jetstream()
        await ensure_streams(js, streams.ALL)
        scoring = asyncio.create_task(scorer.run(js))
        try:
            for kill in range(6):
                scorer.feeder = await serve("feeder", env, tmp_path / "feeder.log")
                # The last one runs on to the end of the second epoch.
                more = 6 if kill < 5 else 2 * len(dataset.problems) + 3 - len(scorer.seen)
                scorer.kill_at = len(scorer.seen) + more if kill < 5 else None
                await scorer.wait_for(len(scorer.seen) + more, scoring)
        finally:
            await scorer.stop_feeder()
            scoring.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scoring
    assert scorer.kills == 5
    keys = sorted(p.key for p in dataset.problems)
    for epoch in (0, 1):
        in_epoch = [t.metadata["key"] for t in scorer.seen if f"-e{epoch}-" in t.id]
        assert sorted(in_epoch) == keys, (epoch, Counter(in_epoch).most_common(3))


class Scorer:
    """Plays generator and validator: takes every task once and scores its one sample.
    It SIGKILLs the feeder the moment the ``kill_at``-th task arrives."""

    def __init__(self) -> None:
        self.seen: list[Task] = []
        self.feeder: asyncio.subprocess.Process | None = None
        self.kill_at: int | None = None
        self.kills = 0

    async def run(self, js: JetStreamContext) -> None:
        sub = await js.pull_subscribe(
            subjects.task_tier(DEFAULT_TIER), durable="scorer", stream=STREAM
        )
        while True:
            try:
                msgs = await sub.fetch(16, timeout=0.2)
            except TimeoutError:
                continue
            for msg in msgs:
                task = TASKS.decode(msg.data)
                self.seen.append(task)
                if len(self.seen) == self.kill_at and self.feeder is not None:
                    self.feeder.send_signal(signal.SIGKILL)
                    self.kills += 1
                await publish_scored(js, scored(task, 0, 1.0))
                await msg.ack()

    async def wait_for(self, count: int, scoring: asyncio.Task[None]) -> None:
        """Until ``count`` tasks have arrived and a killed feeder is gone."""
        async with asyncio.timeout(60):
            while len(self.seen) < count:
                if scoring.done():
                    scoring.result()
                assert self.feeder is not None
                assert self.feeder.returncode is None or self.kill_at, "the feeder exited"
                await asyncio.sleep(0.01)
            if self.kill_at is not None and self.feeder is not None:
                await self.feeder.wait()

    async def stop_feeder(self) -> None:
        if self.feeder is not None and self.feeder.returncode is None:
            self.feeder.send_signal(signal.SIGKILL)
            await self.feeder.wait()
