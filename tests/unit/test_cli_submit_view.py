"""What ``temper submit --wait`` shows: one stdout line per result, progress on stderr."""

from __future__ import annotations

import io

import pytest

from protocol.client import Progress
from protocol.messages import ChatMessage, Rollout, ScoredRollout, Task
from services.cli.submit_view import WaitView

TASK = Task(id="t1", domain="math", prompt=[ChatMessage(role="user", content="x")], n=2)


def scored(sample: int) -> ScoredRollout:
    rollout = Rollout(id=f"t1/{sample}", task=TASK, sample_index=sample)
    return ScoredRollout(id=rollout.id, rollout=rollout, reward=0.5)


class Terminal(io.StringIO):
    """Stands in for a terminal on stderr (the boundary tqdm looks at)."""

    def isatty(self) -> bool:
        return True


def test_without_a_terminal_results_go_to_stdout_and_progress_lines_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = io.StringIO()
    view = WaitView(Progress(0, 2, 0, 1), err=err, line_every_s=0.0)
    view.result(scored(0), Progress(1, 2, 0, 1))
    view.result(scored(1), Progress(2, 2, 1, 1))
    view.close()
    assert capsys.readouterr().out.splitlines() == [
        "scored t1/0 reward=0.5000 status=scored",
        "scored t1/1 reward=0.5000 status=scored",
    ]
    lines = err.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("temper: 2 of 2 samples scored, 1 of 1 tasks complete (")


def test_without_a_terminal_progress_lines_are_spaced_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = io.StringIO()
    view = WaitView(Progress(0, 2, 0, 1), err=err)
    view.result(scored(0), Progress(1, 2, 0, 1))
    assert err.getvalue() == ""  # the first line comes after LINE_EVERY_S
    assert capsys.readouterr().out == "scored t1/0 reward=0.5000 status=scored\n"


def test_on_a_terminal_a_bar_counts_samples_and_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    err = Terminal()
    view = WaitView(Progress(0, 2, 0, 1), err=err)
    view.result(scored(0), Progress(1, 2, 0, 1))
    view.result(scored(1), Progress(2, 2, 1, 1))
    view.close()
    assert "scored t1/1 reward=0.5000 status=scored" in capsys.readouterr().out
    shown = err.getvalue()
    assert "scored: 100%" in shown and "2/2" in shown and "1/1 tasks" in shown
