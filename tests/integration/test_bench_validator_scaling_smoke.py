"""The validator scaling benchmark on a tiny size (its figures are printed, never asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_validator_scaling.py"


def load_bench() -> ModuleType:
    # The bench imports bench_validator from its own folder, as when run as a script.
    if str(BENCH.parent) not in sys.path:
        sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("bench_validator_scaling", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the module executes.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_tiny_run_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
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
    bench = load_bench()
    assert bench.cpu_seconds(bench.os.getpid()) > 0
    assert bench.machine_busy_seconds() > 0
