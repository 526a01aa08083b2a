"""Finding the newest version published after a checkpoint, verified by its digest."""

from __future__ import annotations

from pathlib import Path

from services.learner.ledger import Consumed, Ledger, StepRecord
from services.learner.published import newest_published
from services.model.weights import directory_digest


def _weights(root: Path, version: int) -> str:
    path = root / "weights" / f"v{version}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(f"weights {version}".encode())
    return directory_digest(path)


def _step(ledger: Ledger, step: int, version: int, digest: str, ids: list[str]) -> None:
    ledger.record_step(
        StepRecord(
            step=step,
            applied=True,
            published=True,
            version=version,
            digest=digest,
            batch=f"b{step}",
            rollouts=[Consumed(rollout_id=i, version=0) for i in ids],
            again=[f"again-{step}"],
        )
    )


def test_the_newest_intact_version_after_the_checkpoint_is_chosen(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    _step(ledger, 1, 1, _weights(tmp_path, 1), ["a"])
    position = ledger.position  # the checkpoint was taken here
    _step(ledger, 2, 2, _weights(tmp_path, 2), ["b"])
    _step(ledger, 3, 3, _weights(tmp_path, 3), ["c"])
    _step(ledger, 4, 4, "sha256:" + "0" * 64, ["d"])  # its directory never completed
    found = newest_published(ledger.path, position, tmp_path / "weights", after_version=1)
    assert found is not None and (found.version, found.step) == (3, 3)
    assert found.trained == ["b", "c"]
    assert found.commit == ["b", "c", "again-2", "again-3"]
    assert found.position < ledger.position, "step 4 stays after the resume point"


def test_steps_abandoned_by_a_later_resume_are_not_resumed_from(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    position = ledger.position
    _step(ledger, 1, 1, _weights(tmp_path, 1), ["a"])
    ledger.resume(position=position, recent=[], uncommitted=[], step=0, version=0)
    assert newest_published(ledger.path, position, tmp_path / "weights", after_version=0) is None


def test_nothing_newer_than_the_checkpoint_means_none(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    _step(ledger, 1, 1, _weights(tmp_path, 1), ["a"])
    assert newest_published(ledger.path, 0, tmp_path / "weights", after_version=1) is None
    assert newest_published(tmp_path / "none.jsonl", 0, tmp_path / "weights", 0) is None
