"""The scheduling benchmark's quick run: real nats-server, generator service and torch
engine on the warmed tool-calling policy (built once and cached), and one round of a real
sandbox session's snapshot and restore (figures are printed, never asserted)."""

from __future__ import annotations

import pytest

from tests.benches import load_bench
from tests.required import unavailable

pytestmark = [pytest.mark.integration]


# The first run on a machine warms the policy up (a few minutes on 2 cores); later runs
# find it in the cache.
@pytest.mark.timeout(900)
def test_a_quick_run_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench("bench_scheduling")
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "repeat 1 (" in out and "over 1 repeats (ranges):" in out
    assert "preemption off: high-tier queue p50 " in out and "submit->published p50" in out
    assert "high-tier time (medians): waiting" in out
    # The warmed policy calls its tool: a trajectory that does has two turns at least.
    turns = float(out.split(" turns each", 1)[0].rsplit(" ", 1)[1])
    assert turns >= 2.0, out
    if bench.preemption_available():
        assert "preemption on: high-tier queue p50 " in out
        assert "high-tier p95 queue off/on: " in out
        assert "preemption overhead" in out
    else:
        assert "preemption on: not in this build" in out
    if "real sandbox snapshot: not measured" in out:
        reason = out.split("not measured (", 1)[1].split("\n", 1)[0]
        unavailable("the sandbox image", reason, flag="TEMPER_REQUIRE_DOCKER")
    assert "real sandbox session (" in out and "work intact after restore: yes" in out, out
