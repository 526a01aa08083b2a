"""The validator scaling benchmark on a tiny size (its figures are printed, never asserted)."""

from __future__ import annotations

import pytest

from tests.benches import load_bench


def test_a_tiny_run_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench("bench_validator_scaling")
    assert bench.main(["--rollouts", "300", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "300 arithmetic rollouts a round, 1 rounds of each" in out
    assert "CPU cores, shared by nats-server, the validators and this bench client" in out
    assert "round 1: 1 proc" in out and "round 1: 2 proc" in out
    for figure in ("1 process    rollouts/s", "2 processes  rollouts/s", "scaling 2/1 per round"):
        assert figure in out
    assert "cores busy: validator" in out and "nats-server" in out
    # Both processes of the 2-process round report their stats; together they scored all.
    assert "validate stage" in out and "published per process" in out
    two = out.split("round 1: 2 proc", 1)[1]
    counts = two.split("published per process ", 1)[1].split("\n", 1)[0].split("/")
    assert sum(int(c.replace(",", "")) for c in counts) == 300


def test_cpu_seconds_reads_this_process() -> None:
    bench = load_bench("bench_validator_scaling")
    assert bench.cpu_seconds(bench.os.getpid()) > 0
    assert bench.machine_busy_seconds() > 0
