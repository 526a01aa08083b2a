"""bench/bench_generator.py's plumbing on a one-layer model (figures printed, never asserted)."""

from __future__ import annotations

import pytest

from tests.benches import load_bench


def test_small_run_prints_both_goals(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench("bench_generator")
    argv = ["--trajectories", "2", "--turns", "2", "--layers", "1", "--hidden", "64"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "cache on" in out and "cache off" in out
    # Turn 2 reuses turn 1 whole, and trajectory 2 the system prompt: all but a token or so.
    assert "served from cache" in out and "PASS" in out.split("served from cache")[1]
    assert "speed-up cache on vs off" in out


def test_reusable_is_the_longest_earlier_prefix_but_one_token() -> None:
    bench = load_bench("bench_generator")
    seen = [[1, 2, 3, 4], [1, 2, 9]]
    assert bench.reusable([1, 2, 3, 7], seen) == 3
    assert bench.reusable([1, 2, 3, 4], seen) == 3  # the last token always runs
    assert bench.reusable([5], seen) == 0


def test_render_marks_goals() -> None:
    bench = load_bench("bench_generator")
    on = bench.Lane("cache on", wall_s=1.0, reusable_tokens=100, cached_tokens=95)
    off = bench.Lane("cache off", wall_s=2.0, reusable_tokens=100)
    text = "\n".join(bench.render(on, off, bench.Workload(), "model"))
    assert "95.0%" in text and "2.00x" in text
    assert text.count("PASS") == 1 and text.count("MISS") == 1
