"""The provenance ledger and its checker: lineages, commits that trail a checkpoint,
rollouts trained twice, committed but lost, torn lines, versions."""

from __future__ import annotations

import json
from pathlib import Path

from services.cli import main
from services.learner.ledger import Consumed, Ledger, StepRecord
from services.learner.ledger_check import check


def _step(
    ledger: Ledger,
    step: int,
    ids: list[str],
    again: list[str] | None = None,
    version: int | None = None,
) -> None:
    ledger.record_step(
        StepRecord(
            step=step,
            applied=True,
            published=True,
            version=step if version is None else version,
            digest=f"d{step}",
            batch=f"b{step}",
            rollouts=[Consumed(rollout_id=i, version=0, trace_id=f"t-{i}") for i in ids],
            again=again or [],
        )
    )


def _commit(ledger: Ledger, *, all_closed: bool = False) -> list[str]:
    intervals, ids = ledger.committable(all_closed=all_closed)
    ledger.committed(intervals, ids, through_step=0)
    return ids


def test_commits_trail_one_checkpoint_and_a_clean_stop_commits_all(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    _step(ledger, 1, ["a", "b"])
    ledger.checkpointed()
    assert _commit(ledger) == [], "the newest checkpoint's interval waits for the next one"
    _step(ledger, 2, ["c"])
    ledger.checkpointed()
    assert _commit(ledger) == ["a", "b"]
    assert ledger.waiting(all_intervals=True) == 1
    _step(ledger, 3, ["d"])
    ledger.checkpointed()
    assert _commit(ledger, all_closed=True) == ["c", "d"]
    report = check(ledger.path)
    assert report.ok and report.trained == 4 and report.committed == 4


def test_a_resume_abandons_the_steps_after_its_checkpoint(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    _step(ledger, 1, ["a", "b"])
    position = ledger.position
    ledger.checkpointed()
    _step(ledger, 2, ["c", "d"])  # the learner dies before its next checkpoint
    again = Ledger(tmp_path)
    again.resume(position=position, recent=["a", "b"], uncommitted=["a", "b"], step=1, version=1)
    assert again.trained("a") and not again.trained("c")
    assert _commit(again, all_closed=True) == ["a", "b"], "the checkpoint covers a and b"
    # The buffer serves c and d again (released), and a too (redelivered after a restart
    # of the buffer): a is not retrained, and the versions number on past the abandoned one.
    _step(again, 2, ["c", "d"], again=["a"], version=3)
    again.checkpointed()
    _step(again, 3, ["e"], version=4)
    again.checkpointed()
    _commit(again, all_closed=True)
    report = check(again.path)
    assert report.abandoned_steps == 1 and report.resumes == 1
    assert report.ok, report.summary()
    assert report.trained_ids == {"a", "b", "c", "d", "e"}


def test_the_checker_finds_twice_trained_lost_and_uncommitted(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    _step(ledger, 1, ["a", "b"])
    _step(ledger, 2, ["b", "c"])
    ledger.checkpointed()
    _commit(ledger, all_closed=True)
    position = ledger.position
    _step(ledger, 3, ["x"])
    ledger.checkpointed()
    _commit(ledger, all_closed=True)  # committed, then the learner rolls back past it
    _step(ledger, 4, ["y"])
    ledger.resume(position=position, recent=[], uncommitted=[], step=2, version=2)
    report = check(ledger.path)
    assert report.trained_twice == ["b"]
    assert report.lost == ["x"]
    assert report.uncommitted == []
    assert not report.ok


def test_versions_must_strictly_increase_across_lineages(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    _step(ledger, 1, ["a"])
    _step(ledger, 2, ["b"])
    ledger.resume(position=0, recent=[], uncommitted=[], step=0, version=0)
    _step(ledger, 1, ["a"])  # a learner that re-issued version 1
    report = check(ledger.path)
    assert report.version_errors == ["step 1 published version 1 after version 2"]


def test_a_torn_last_line_is_isolated_and_counted(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    _step(ledger, 1, ["a"])
    with ledger.path.open("a") as out:
        out.write('{"kind":"step","step":2,"rollou')
    again = Ledger(tmp_path)
    _step(again, 2, ["b"])
    report = check(again.path)
    assert report.torn_lines == 1 and report.trained_ids == {"a", "b"}


def test_temper_ledger_check_exit_codes_and_json(tmp_path: Path, capsys: object) -> None:
    ledger = Ledger(tmp_path / "learner")
    _step(ledger, 1, ["a"])
    ledger.checkpointed()
    assert main(["ledger", "check", str(tmp_path)]) == 1, "a is trained but not committed"
    assert main(["ledger", "check", str(tmp_path), "--running"]) == 0
    _commit(ledger, all_closed=True)
    assert main(["ledger", "check", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert json.loads(out[out.index("{") :])["ok"] is True
    assert main(["ledger", "check", str(tmp_path / "nowhere")]) == 2


def test_a_step_that_published_nothing_keeps_the_version(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    _step(ledger, 1, ["a"])
    ledger.record_step(
        StepRecord(
            step=2,
            applied=True,
            published=False,
            version=1,
            digest="d1",
            batch="b",
            rollouts=[Consumed(rollout_id="b", version=1)],
        )
    )
    _step(ledger, 3, ["c"], version=2)
    assert check(ledger.path).version_errors == []
