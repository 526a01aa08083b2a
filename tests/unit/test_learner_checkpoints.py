"""Checkpoints: the last K kept, a damaged one named in an error and skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
import torch

from services.learner.checkpoints import CheckpointStore, CheckpointUnreadable, read
from services.learner.trainer import Trainer, TrainerConfig


def _state(version: int) -> dict[str, object]:
    return {
        "model": {"w": torch.full((4,), float(version))},
        "optimizer": {},
        "step": version,
        "version": version,
    }


def test_only_the_last_k_are_kept_newest_first(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for version in (3, 7, 12):
        store.save(_state(version), version)
    assert [p.name for p in store.candidates()] == ["v00000012.pt", "v00000007.pt"]
    assert not list(store.directory.glob("*.tmp"))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "not_a_state"])
def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_used(
    tmp_path: Path, damage: str
) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    store.save(_state(4), 4)
    newest = store.save(_state(9), 9)
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        newest.write_bytes(b"\x00not a checkpoint" * 10)
    elif damage == "empty":
        newest.write_bytes(b"")
    else:
        torch.save({"step": 9}, newest)
    with structlog.testing.capture_logs() as logs:
        loaded = store.load_newest(torch.device("cpu"))
    assert loaded is not None and loaded.state["version"] == 4
    assert [e.path for e in loaded.skipped] == [newest]
    errors = [e for e in logs if e["event"] == "checkpoint_unreadable"]
    assert errors and errors[0]["path"] == str(newest) and errors[0]["reason"]
    with pytest.raises(CheckpointUnreadable, match=str(newest)):
        read(newest, torch.device("cpu"))


def test_no_readable_checkpoint_means_a_fresh_start(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.load_newest(torch.device("cpu")) is None
    store.save(_state(1), 1).write_bytes(b"x")
    assert store.load_newest(torch.device("cpu")) is None


def test_the_trainer_falls_back_to_its_previous_checkpoint(
    tiny_model: Path, tmp_path: Path
) -> None:
    trainer = Trainer(tiny_model, tmp_path, TrainerConfig(keep_checkpoints=2))
    trainer.version = 5
    trainer.save_checkpoint({"ledger": {"position": 10}})
    trainer.version = 6
    trainer.save_checkpoint({"ledger": {"position": 20}}).write_bytes(b"torn")
    again = Trainer(tiny_model, tmp_path, TrainerConfig(keep_checkpoints=2))
    loaded = again.resume()
    assert loaded is not None and again.version == 5
    assert loaded.state["extra"]["ledger"]["position"] == 10


def test_a_legacy_single_checkpoint_is_still_resumed(tmp_path: Path) -> None:
    torch.save(_state(2), tmp_path / "checkpoint.pt")
    store = CheckpointStore(tmp_path)
    loaded = store.load_newest(torch.device("cpu"))
    assert loaded is not None and loaded.path.name == "checkpoint.pt"
