"""``temper train`` (what ``make run`` runs), shortened to three minutes: the whole stack
comes up, the policy learns on held-out problems it never trained on, the user sees a
progress line, TensorBoard files and a PNG, and nothing is left running."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.integration.test_cli_harness import finish, free_port, start

HELDOUT_KEYS = {"version", "elapsed_s", "greedy_accuracy", "sampled_accuracy", "problems", "chance"}


@pytest.mark.timeout(720)
async def test_train_learns_on_heldout_problems_and_shows_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "train"
    proc = await start(
        "nats://127.0.0.1:1",  # not used: train starts its own nats-server
        "train",
        "--run-dir",
        str(run_dir),
        "--nats-port",
        str(free_port()),
        "--minutes",
        "3",
        "--eval-every",
        "1000",
    )
    done = await finish(proc, timeout_s=660)
    assert done.code == 0, done.out + done.err
    assert re.search(r"\d+/180 s: step \d+, samples/s \d+, reward \d\.\d+", done.out), done.out
    assert re.search(r"held-out greedy accuracy [\d.]+% \(v0\) -> [\d.]+% \(v\d+\)", done.out)
    lines = [json.loads(x) for x in (run_dir / "eval" / "heldout.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(HELDOUT_KEYS <= set(line) for line in lines)
    start_, end = lines
    assert start_["version"] == 0 and end["version"] >= 20 and end["problems"] > 100
    # Learning, measured on problems never trained on: clearly above the start.
    assert end["sampled_accuracy"] >= start_["sampled_accuracy"] + 0.08, lines
    assert end["greedy_accuracy"] >= start_["greedy_accuracy"] - 0.05, lines
    assert (run_dir / "train.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for board in (run_dir / "learner" / "tensorboard", run_dir / "tensorboard" / "heldout"):
        assert any(p.name.startswith("events.out.tfevents") for p in board.iterdir()), board
    text = (run_dir / "learner" / "metrics.jsonl").read_text()
    metrics = [json.loads(m) for m in text.splitlines()]
    # Two clipped updates per batch: the clip acts; admission keeps stale drops rare.
    assert max(m["loss_clip_fraction"] for m in metrics) > 0
    assert sum(m["dropped_stale"] for m in metrics) < 256
    pids = [int(p) for p in re.findall(r"\(pid (\d+)", done.out)]
    assert pids
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
