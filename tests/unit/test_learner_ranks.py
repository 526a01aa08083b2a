"""The follower loop and rank 0's messages, without a process group: a channel that
replays messages and a one-rank ``DataParallel`` whose collectives do nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from protocol.codec import Codec
from services.learner.distributed import DataParallel, ParallelSettings
from services.learner.loss import LossStats
from services.learner.ranks import (
    Follower,
    Gather,
    Idle,
    Leader,
    OutOfStep,
    RankMessage,
    Stop,
    Sync,
    Train,
    checksum,
    torchrun_command,
)
from services.learner.settings import LearnerSettings
from services.learner.trainer import Trainer, _even_slices
from services.runtime.settings import SettingsError
from tests.integration.ddp_step_worker import CONFIG, batch
from tests.unit.test_cli_parsing import run_main

MESSAGES: Codec[RankMessage] = Codec(RankMessage)


class _Alone(DataParallel):
    """One rank: nothing to broadcast or sum."""

    def __init__(self) -> None:
        super().__init__(ParallelSettings(rank=1, world_size=1, local_rank=1), "cpu")
        self.prepared = 0

    def prepare(self, model: torch.nn.Module) -> None:
        self.prepared += 1

    def reduce(self, model: torch.nn.Module, stats: list[LossStats]) -> list[LossStats]:
        return stats


class _Replay:
    """Hands out the messages rank 0 would have sent; sends are recorded."""

    def __init__(self, messages: list[RankMessage] | None = None) -> None:
        # Through the codec, as on the wire.
        self._queue: Iterator[bytes] = iter([MESSAGES.encode(m) for m in messages or []])
        self.sent: list[RankMessage] = []

    def receive(self) -> RankMessage:
        return MESSAGES.decode(next(self._queue))

    def send(self, message: RankMessage) -> None:
        self.sent.append(message)


def _follower(tiny_model: Path, tmp_path: Path, channel: _Replay) -> tuple[Follower, Trainer]:
    settings = LearnerSettings(model=tiny_model, out_dir=tmp_path)
    parallel = _Alone()
    follower = Follower(settings, parallel, channel)  # type: ignore[arg-type]
    return follower, Trainer(tiny_model, tmp_path, CONFIG, parallel=parallel)


def test_messages_cross_as_typed_msgpack() -> None:
    train = Train(step=3, version=5, checksum=1.25, items=batch()[:2])
    assert MESSAGES.decode(MESSAGES.encode(train)) == train
    sync = Sync(checkpoint="/c/v1.pt", weights="/w/v2")
    for message in (sync, Gather(optimizer=True), Idle(), Stop(reason="done")):
        assert MESSAGES.decode(MESSAGES.encode(message)) == message


def test_a_follower_loads_the_named_checkpoint_takes_the_steps_and_stops(
    tiny_model: Path, tmp_path: Path
) -> None:
    leader = Trainer(tiny_model, tmp_path / "leader", CONFIG)
    leader.train(batch())
    saved = leader.save_checkpoint()
    leader.version = 7  # an export moved it on rank 0 only
    messages: list[RankMessage] = [
        Sync(checkpoint=str(saved)),
        Idle(),
        Train(step=leader.step, version=7, checksum=checksum(leader.model), items=batch()),
        Stop(reason="test"),
    ]
    follower, trainer = _follower(tiny_model, tmp_path / "follower", _Replay(messages))
    assert follower.follow(trainer) == 0
    assert trainer.checkpoint == saved and follower.steps == 1
    assert trainer.version == 7 and trainer.step == leader.step + 1
    assert follower.parallel.micro_batches > 0


def test_a_follower_whose_weights_differ_stops_the_job(tiny_model: Path, tmp_path: Path) -> None:
    follower, trainer = _follower(tiny_model, tmp_path, _Replay())
    wrong = checksum(trainer.model) + 1.0
    channel = _Replay([Train(step=0, version=0, checksum=wrong, items=batch())])
    follower._channel = channel  # type: ignore[assignment]
    with pytest.raises(OutOfStep, match="rank 1 is out of step before step 1"):
        follower.follow(trainer)


def test_rank_zero_announces_each_step_and_marks_itself_broken_when_one_fails(
    tiny_model: Path, tmp_path: Path
) -> None:
    channel = _Replay()
    leader = Leader(_Alone(), channel, timeout_s=60.0)  # type: ignore[arg-type]
    trainer = Trainer(tiny_model, tmp_path, CONFIG)
    before = checksum(trainer.model)
    leader.train(trainer, batch())
    [sent] = channel.sent
    assert isinstance(sent, Train) and sent.checksum == before and len(sent.items) == 12
    leader.idle()
    assert len(channel.sent) == 1, "rank 0 spoke just now: no idle message yet"

    def fail(message: RankMessage) -> None:
        raise RuntimeError("Connection reset by peer")

    channel.send = fail  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        leader.train(trainer, batch())
    assert leader.broken


def test_parallel_is_ddp_or_fsdp() -> None:
    assert LearnerSettings().parallel == "ddp"
    assert LearnerSettings(parallel="fsdp").parallel == "fsdp"
    with pytest.raises(SettingsError, match="TEMPER_LEARNER_PARALLEL='zero' is not one of"):
        LearnerSettings(parallel="zero")


@pytest.mark.parametrize(
    ("rows", "size", "sizes"),
    [(6, 2, [1, 2, 1, 2]), (2, 2, [1, 1]), (8, 2, [2, 2, 2, 2]), (1, 2, [1])],
)
def test_sharded_micro_batches_split_evenly_over_the_ranks(
    rows: int, size: int, sizes: list[int]
) -> None:
    """As many on every rank, none larger than asked; too few rows stay for ``share``."""
    slices = [slice(start, start + size) for start in range(0, rows, size)]
    if len(slices) % 2:
        slices = _even_slices(slices, rows, 2)
    assert [len(range(rows)[s]) for s in slices] == sizes


def test_the_convenience_command_is_torchrun_on_this_host() -> None:
    command = torchrun_command(4)
    assert command[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert "--nproc-per-node=4" in command
    assert command[-4:] == ["-m", "services", "serve", "learner"]


def test_nproc_is_for_the_learner_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["serve", "replay", "--nproc", "2"], capsys)
    assert code == 2 and "runs the learner only" in err


def test_a_rank_without_torchrun_s_whole_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    code, err = run_main(["serve", "learner"], capsys)
    assert code == 2 and "start the learner with torchrun" in err
