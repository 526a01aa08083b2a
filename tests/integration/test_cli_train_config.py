"""``temper train --config RUN.toml`` with two built-in domains: the feeder draws both, the
validator scores both, and every evaluation reports each domain and their macro average."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from services.evaluation.heldout import MACRO
from tests.integration.test_cli_harness import finish, free_port, start
from tests.integration.test_cli_train import _all_gone

DOMAINS = ("arithmetic", "arithmetic_sum3")


@pytest.mark.timeout(300)
async def test_a_run_config_trains_and_evaluates_every_domain(
    tmp_path: Path, tiny_model: Path
) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "mix.toml"
    # A given model starts as it is: no warm-up to build.  It answers nothing right, so
    # the learner skips its steps (no reward spread) and the half minute ends the run.
    config.write_text(
        f"""
model = "{tiny_model}"
run_dir = "{run_dir}"

[[domains]]
name = "arithmetic"
weight = 4

[[domains]]
name = "arithmetic_sum3"
weight = 1

[learner]
batch = 16
group = 2

[feeder]
in_flight = 8

[budget]
minutes = 0.5

[eval]
problems = 6
"""
    )
    proc = await start(
        "nats://127.0.0.1:1",  # not used: train starts its own nats-server
        "train",
        "--config",
        str(config),
        "--nats-port",
        str(free_port()),
        "--max-steps",
        "2",
        "--warmup-steps",
        "0",
        "--eval-every",
        "0",
        "--eval-samples",
        "0",
    )
    done = await finish(proc, timeout_s=240)
    assert done.code == 0, done.out + done.err
    assert f"start policy: {tiny_model}" in done.out
    drawn = {
        name: int(count)
        for name, count in re.findall(r"fed (\w+): (\d+) tasks drawn, \d+ done", done.out)
    }
    assert set(drawn) == set(DOMAINS) and drawn["arithmetic_sum3"] > 0
    # Drawn by weight (4:1; about 100 draws, so 2:1 is 3.5 standard deviations off), not
    # by which domain's tasks come back first (about 5:3 here, each domain holding its
    # bound of tasks in flight).  The exact shares are tests/unit/test_run_config.py's.
    assert drawn["arithmetic"] >= 2 * drawn["arithmetic_sum3"], drawn
    _scored_both(run_dir)
    _evaluated_both(run_dir)
    assert re.search(r"held-out \(macro average\) v\d+ at \d+ s: greedy", done.out), done.out
    assert "macro-averaged held-out greedy accuracy" in done.out
    _all_gone(done.out)


def _scored_both(run_dir: Path) -> None:
    """The validator scored rollouts of both domains (its last statistics, per domain)."""
    stats = json.loads((run_dir / "stats.json").read_text())
    validator = next(e["values"] for e in stats.values() if e["service"] == "validator")
    for name in DOMAINS:
        assert validator[f"domain.{name}.rollouts"] > 0, validator


def _evaluated_both(run_dir: Path) -> None:
    """Two evaluations (start and end), a line per domain each, and their macro average."""
    text = (run_dir / "eval" / "heldout.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert sorted((x["evaluation"], x["domain"]) for x in lines) == [
        (1, "arithmetic"),
        (1, "arithmetic_sum3"),
        (2, "arithmetic"),
        (2, "arithmetic_sum3"),
    ]
    assert all(x["problems"] == 6 and x["samples"] == 0 for x in lines), lines
    text = (run_dir / "eval" / "heldout_macro.jsonl").read_text()
    macro = [json.loads(line) for line in text.splitlines()]
    assert [m["evaluation"] for m in macro] == [1, 2]
    for line in macro:
        assert line["domain"] == MACRO and line["domains"] == list(DOMAINS)
        parts = [x["greedy_accuracy"] for x in lines if x["evaluation"] == line["evaluation"]]
        assert line["greedy_accuracy"] == pytest.approx(sum(parts) / 2)
        tiers = json.loads(Path(line["tiers_file"]).read_text())
        assert set(tiers["domains"]) == set(DOMAINS)
