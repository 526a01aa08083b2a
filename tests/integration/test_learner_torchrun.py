"""The learner service under torchrun (two CPU ranks, gloo, loopback) against a real
nats-server and replay buffer: rank 0 serves, rank 1 follows and takes part in every
step; a clean stop ends both ranks; ``kill -9`` of either rank ends the job in bounded
time, and the restarted job trains every rollout exactly once.  Sharded (``fsdp``), the
published weights are what one process trains from the same batches, and a restarted
job resumes from the gathered checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from safetensors.torch import load_file

from protocol import subjects
from protocol.codec import Codec
from protocol.messages import ScoredRollout, Stats
from protocol.packed import pack_f32
from services.learner.checkpoints import CheckpointStore
from services.learner.checkpoints import read as read_checkpoint
from services.learner.ledger_check import LedgerReport, check
from services.learner.settings import LearnerSettings
from services.learner.trainer import Trainer, TrainerConfig
from services.model.weights import WEIGHTS_FILE, unique_tensors
from services.replay.service import ReplayService, ReplaySettings
from tests.integration.chaos import policy_updates
from tests.integration.support import client, runtime
from tests.integration.test_replay_service import _publish
from tests.integration.test_supervisor import alive
from tests.unit.test_replay_buffer import scored

REPO = Path(__file__).resolve().parents[2]
#: Eight samples a step in micro-batches of two: four micro-batches, two for each rank.
BATCH = 8
#: Sharded, with a learning rate large enough that a few steps move the weights well past
#: float rounding, and a checkpoint after every step.
SHARDED = {
    "TEMPER_LEARNER_PARALLEL": "fsdp",
    "TEMPER_LEARNER_LR": "1e-2",
    "TEMPER_LEARNER_CHECKPOINT_EVERY": "1",
}
#: torchrun gives a stopping rank 30 s before it kills it; the rest is start-up slack.
EXIT_BOUND_S = 60.0


@dataclass
class Job:
    """One ``temper serve learner --nproc 2`` (torchrun and its two ranks)."""

    proc: asyncio.subprocess.Process
    log: Path

    def lines(self) -> list[dict[str, Any]]:
        """The JSON log lines of both ranks (torchrun's own lines are not JSON)."""
        out = []
        for raw in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if isinstance(line, dict):
                    out.append(line)
        return out

    def events(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            line
            for line in self.lines()
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items())
        ]

    async def pid(self, rank: int) -> int:
        deadline = time.monotonic() + 120
        while not (found := self.events("rank_started", rank=rank)):
            assert self.proc.returncode is None, f"the job ended:\n{self.tail()}"
            assert time.monotonic() < deadline, f"rank {rank} never started:\n{self.tail()}"
            await asyncio.sleep(0.2)
        return int(found[-1]["pid"])

    async def wait(self, timeout_s: float) -> int:
        async with asyncio.timeout(timeout_s):
            return await self.proc.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


def _env(nats_url: str, model: Path, out: Path, overrides: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        "TEMPER_NATS_URL": nats_url,
        # One instance name across restarts, as a supervisor gives it.
        "TEMPER_INSTANCE": "learner-torchrun",
        "TEMPER_STATS_S": "0.5",
        "TEMPER_HEARTBEAT_S": "1",
        "TEMPER_LEARNER_MODEL": str(model),
        "TEMPER_LEARNER_OUT_DIR": str(out),
        "TEMPER_LEARNER_BATCH_SIZE": str(BATCH),
        "TEMPER_LEARNER_MICRO_BATCH": "2",
        "TEMPER_LEARNER_MIN_SAMPLES": "2",
        "TEMPER_LEARNER_SAMPLE_WAIT_S": "0.3",
        "TEMPER_LEARNER_CHECKPOINT_EVERY": "3",
        "TEMPER_LEARNER_TENSORBOARD": "false",
        "TEMPER_LEARNER_THREADS": "1",
        "TEMPER_LEARNER_RANK_TIMEOUT_S": "60",
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        **overrides,
    }


@contextlib.asynccontextmanager
async def _job(
    nats_url: str, model: Path, out: Path, name: str, **overrides: str
) -> AsyncIterator[Job]:
    """torchrun in a session of its own, so that whatever is left of it at the end (a
    failed test) is ended with it."""
    log = out.parent / f"{name}.log"
    command = [sys.executable, "-m", "services", "serve", "learner", "--nproc", "2"]
    with log.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            *command,
            cwd=REPO,
            env=_env(nats_url, model, out, overrides),
            stdout=sink,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    job = Job(proc, log)
    try:
        yield job
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


@contextlib.asynccontextmanager
async def _replay(nats_url: str) -> AsyncIterator[ReplayService]:
    # Re-served rollouts are old by then: staleness must not drop them in this test.
    settings = ReplaySettings(
        runtime=runtime(nats_url, instance="replay-torchrun"), max_staleness=100_000, ack_wait_s=5
    )
    replay = ReplayService(settings)
    async with replay:
        yield replay


async def _feed(
    nats_url: str, groups: range, make: Callable[[str, int], ScoredRollout] = scored
) -> set[str]:
    items = [make(f"g{group}", index) for group in groups for index in (0, 1)]
    async with client(nats_url) as nc:
        await _publish(nc, items)
    return {item.id for item in items}


def _ledger(out: Path) -> Path:
    return out / "ledger.jsonl"


def _steps(out: Path) -> int:
    path = _ledger(out)
    return path.read_text().count('"kind":"step"') if path.exists() else 0


async def _until_trained(out: Path, wanted: set[str], job: Job) -> LedgerReport:
    async with asyncio.timeout(180):
        while True:
            assert job.proc.returncode is None, f"the job ended early:\n{job.tail()}"
            if _ledger(out).exists():
                report = check(_ledger(out))
                if report.trained_ids >= wanted:
                    return report
            await asyncio.sleep(0.5)


async def _stats(nats_url: str) -> Stats:
    codec: Codec[Stats] = Codec(Stats)
    async with client(nats_url) as nc:
        sub = await nc.subscribe(subjects.stats("learner"))
        stats = codec.decode((await sub.next_msg(timeout=10)).data)
        await sub.unsubscribe()
    return stats


async def _stop(job: Job) -> int:
    """SIGTERM to torchrun, as a supervisor stops it."""
    job.proc.send_signal(signal.SIGTERM)
    return await job.wait(EXIT_BOUND_S)


@pytest.mark.timeout(300)
async def test_two_ranks_serve_train_publish_and_stop(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "learner"
    async with _replay(nats_url), _job(nats_url, tiny_model, out, "serve") as job:
        wanted = await _feed(nats_url, range(16))
        follower = await job.pid(1)
        leader = await job.pid(0)
        await _until_trained(out, wanted, job)
        stats = await _stats(nats_url)
        assert stats.values["world_size"] == 2.0
        await _stop(job)
        assert not alive(leader) and not alive(follower), "a clean stop ends every rank"
        steps = check(_ledger(out)).steps
        taken = job.events("rank_step", rank=1)
        assert [line["step"] for line in taken] == list(range(1, steps + 1)), job.tail()
        assert all(line["micro_batches"] == 2 for line in taken), taken
        assert job.events("rank_stopped", rank=1, steps=steps), job.tail()
    updates = await policy_updates(nats_url)
    assert [u.version for u in updates] == list(range(1, steps + 1))
    report = check(_ledger(out))
    assert report.trained_ids == wanted and report.ok, report.summary()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("rank", [1, 0])
async def test_killed_rank_ends_the_job_and_the_restart_trains_each_rollout_once(
    rank: int, nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "learner"
    async with _replay(nats_url):
        wanted = await _feed(nats_url, range(40))
        async with _job(nats_url, tiny_model, out, "killed") as job:
            victim, other = await job.pid(rank), await job.pid(1 - rank)
            async with asyncio.timeout(120):
                while _steps(out) < 4:
                    assert job.proc.returncode is None, job.tail()
                    await asyncio.sleep(0.1)
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            code = await job.wait(EXIT_BOUND_S)
            print(f"torchrun exited {code} {time.monotonic() - killed:.1f}s after the kill")
            assert code != 0
            assert not alive(other), "the other rank ended with the job"
        before = check(_ledger(out))
        assert before.trained_ids < wanted, "the kill came after the last step: nothing to resume"
        async with _job(nats_url, tiny_model, out, "restarted") as job:
            await _until_trained(out, wanted, job)
            await _stop(job)
            [synced] = job.events("rank_synchronised", rank=1)
            assert synced["checkpoint"], "rank 1 resumed from rank 0's checkpoint"
    report = check(_ledger(out))
    assert report.trained_ids == wanted, report.summary()
    assert report.trained_twice == [] and report.lost == [] and report.version_errors == []
    assert report.uncommitted == [] and report.resumes >= 1, report.summary()


@pytest.mark.timeout(200)
async def test_killing_torchrun_ends_every_rank(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    """torchrun starts each rank in a session of its own: without the ranks' watch on
    their parent, rank 0 would go on serving after a ``kill -9`` of the launcher."""
    out = tmp_path / "learner"
    async with _replay(nats_url), _job(nats_url, tiny_model, out, "agent") as job:
        ranks = [await job.pid(0), await job.pid(1)]
        os.kill(job.proc.pid, signal.SIGKILL)
        await job.wait(10)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        left = [pid for pid in ranks if alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"ranks {left} outlived torchrun:\n{job.tail()}"
        assert len(job.events("parent_exited")) == 2, job.tail()


@pytest.mark.timeout(300)
async def test_sharded_ranks_publish_the_single_process_weights_and_resume(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "learner"
    store = CheckpointStore(out)
    async with _replay(nats_url):
        first = await _feed(nats_url, range(8), _likely)
        async with _job(nats_url, tiny_model, out, "fsdp", **SHARDED) as job:
            await _until_trained(out, first, job)
            await _stop(job)
            steps = check(_ledger(out)).steps
            assert job.events("rank_stopped", rank=1, steps=steps), job.tail()
        published, exported = _newest_weights(out)
        single = _replayed(tiny_model, out, tmp_path / "single", _Start(), after=0)
        _assert_close(exported, unique_tensors(single.model), unique_tensors(_start(tiny_model)))
        # The gathered checkpoint loads in one process too, and holds the exported weights.
        newest, older = store.candidates()[:2]
        single.load_checkpoint(newest)
        assert all(torch.equal(v, exported[k]) for k, v in unique_tensors(single.model).items())
        # Without it, the restart resumes the older checkpoint (its sharded optimizer state
        # included) and takes the newer published weights: it checkpoints them before the
        # other rank has synchronised, which must then load them too.
        newest.unlink()
        second = await _feed(nats_url, range(8, 12), _likely)
        async with _job(nats_url, tiny_model, out, "fsdp-resumed", **SHARDED) as job:
            await _until_trained(out, first | second, job)
            await _stop(job)
            synced = job.events("rank_synchronised", rank=1)
            assert synced[0]["weights"] == str(published.resolve()), job.tail()
        resumed = read_checkpoint(newest, torch.device("cpu"))["model"]
        assert all(torch.equal(resumed[k], v) for k, v in exported.items())
    start = _Start(checkpoint=older, weights=published, step=steps)
    single = _replayed(tiny_model, out, tmp_path / "single-resumed", start, after=steps)
    _, final = _newest_weights(out)
    _assert_close(final, unique_tensors(single.model), exported)
    report = check(_ledger(out))
    assert report.trained_ids == first | second and report.ok, report.summary()
    assert report.trained_twice == [] and report.resumes >= 1, report.summary()


@dataclass(frozen=True)
class _Start:
    """Where a single-process replay starts: the start model, or a checkpoint and the
    published weights taken after it, as the restarted learner did."""

    checkpoint: Path | None = None
    weights: Path | None = None
    step: int = 0


def _newest_weights(out: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    versions = [p for p in (out / "weights").glob("v*") if p.name[1:].isdigit()]
    newest = max(versions, key=lambda p: int(p.name[1:]))
    return newest, load_file(newest / WEIGHTS_FILE)


def _start(model: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    start: torch.nn.Module = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    return start


def _replayed(model: Path, out: Path, work: Path, start: _Start, after: int) -> Trainer:
    """One process trained on the batches the ledger says the ranks trained on after step
    ``after``, with one thread as each rank has: Adam's first updates are about ``lr``
    times the sign of each gradient entry, so another thread count's rounding flips some.
    For the same reason it runs every row whole, as FSDP does: the prompt shared among
    rows is the same sum in another order."""
    lr = float(SHARDED["TEMPER_LEARNER_LR"])
    config = TrainerConfig(lr=lr, micro_batch=2, share_prompts=False)
    settings = LearnerSettings(model=model, out_dir=out, trainer=config)
    trainer = Trainer(model, work, settings.trainer_config())
    if start.checkpoint is not None:
        trainer.load_checkpoint(start.checkpoint)
    if start.weights is not None:
        trainer.load_weights(start.weights, version=0, step=start.step, samples=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for raw in _ledger(out).read_text().splitlines():
            record = json.loads(raw)
            if record.get("kind") == "step" and record["step"] > after:
                ids = [r["id"] for r in record["rollouts"]]
                trainer.train([_likely(*_task_and_index(i)) for i in ids])
    finally:
        torch.set_num_threads(threads)
    return trainer


def _likely(task_id: str, index: int) -> ScoredRollout:
    """A sample whose behaviour logprob is near the tiny model's (about -7.6): importance
    weights near 1 give gradients well above Adam's epsilon, where float rounding (one
    thread or several) would decide the update."""
    item = scored(task_id, index)
    rollout = msgspec.structs.replace(item.rollout, logprobs=pack_f32([-7.5]))
    return msgspec.structs.replace(item, rollout=rollout)


def _task_and_index(rollout_id: str) -> tuple[str, int]:
    task, index = rollout_id.split("/")
    return task, int(index)


def _assert_close(
    ours: dict[str, torch.Tensor], single: dict[str, torch.Tensor], start: dict[str, torch.Tensor]
) -> None:
    assert ours.keys() == single.keys()
    moved = max(float((single[k] - start[k]).abs().max()) for k in single)
    assert moved > 1e-4, "training did not move the weights; the comparison proves nothing"
    for name, value in ours.items():
        gap = float((value - single[name]).abs().max())
        assert gap <= 1e-2 * moved, f"{name}: {gap:.3g} off the single process ({moved:.3g})"
