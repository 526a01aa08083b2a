"""The gateway benchmarks, shortened: each starts its stack (``temper up``), runs both of
its sides and prints every figure (printed, never asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benches import load_bench

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_the_overhead_bench_prints_both_paths_and_the_goals(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = load_bench("bench_gateway")
    argv = ["--sessions", "4", "--calls", "2", "--rounds", "1", "--alone-calls", "3"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "one caller, 3 calls each: p50 direct" in out and "4 callers at once:" in out
    assert "direct   8 calls" in out and "gateway  8 calls" in out
    assert out.count("CPU ms per call:") == 2 and "gateway " in out.split("CPU ms")[2]
    assert "added by the gateway, over 1 rounds: p50" in out and "(goal >= 0.8)" in out


def test_the_agent_bench_runs_control_and_trained(
    tool_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench("bench_gateway_agent")
    plot = tmp_path / "agent.png"
    argv = ["--model", str(tool_policy), "--minutes", "0.1", "--window", "2"]
    assert bench.main([*argv, "--batch", "8", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "control " in out and "0 learner steps" in out and "trained " in out
    assert "trained last window / control mean:" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
