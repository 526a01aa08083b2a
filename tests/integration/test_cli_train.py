"""``temper train`` (what ``make run`` runs), shortened: the whole stack comes up, the
learner takes steps and publishes versions, the summary compares rewards, and nothing
is left running."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.integration.test_cli_harness import finish, free_port, start


@pytest.mark.timeout(400)
async def test_train_runs_the_loop_and_reports_learning_figures(tmp_path: Path) -> None:
    run_dir = tmp_path / "train"
    proc = await start(
        "nats://127.0.0.1:1",  # not used: train starts its own nats-server
        "train",
        "--run-dir",
        str(run_dir),
        "--nats-port",
        str(free_port()),
        "--minutes",
        "1.5",
        "--warmup-steps",
        "5",
        "--group",
        "4",
        "--batch",
        "16",
        "--in-flight",
        "8",
    )
    done = await finish(proc, timeout_s=360)
    assert done.code == 0, done.out + done.err
    steps = re.findall(r"step +(\d+) +version +(\d+) +reward (\d\.\d+)", done.out)
    assert len(steps) >= 4, done.out
    assert re.search(r"learner steps: mean reward of the first \d+ \d\.\d+", done.out)
    metrics = (run_dir / "learner" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) >= len(steps)
    assert max(json.loads(m)["version"] for m in metrics) >= 3
    versions = sorted((run_dir / "learner" / "weights").iterdir())
    assert versions and (versions[-1] / "model.safetensors").is_file()
    pids = [int(p) for p in re.findall(r"\(pid (\d+)", done.out)]
    assert pids
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
