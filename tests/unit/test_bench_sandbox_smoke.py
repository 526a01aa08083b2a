"""The sandbox benchmark's plumbing, without Docker (its figures are printed, never asserted)."""

from __future__ import annotations

import asyncio

import pytest

from tests.benches import load_bench


def test_without_docker_it_says_skipped_and_succeeds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench("bench_sandbox")
    monkeypatch.setattr(bench, "docker_problem", lambda: "the docker CLI is not installed")
    assert bench.main() == 0
    out = capsys.readouterr().out
    assert "the docker CLI is not installed" in out
    assert out.strip().endswith("skipped: no Docker engine")


def test_percentile_is_nearest_rank() -> None:
    percentile = load_bench("bench_sandbox").percentile
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile([3.0], 95) == 3.0
    assert percentile([], 50) == 0.0


def test_drive_runs_every_index_once_at_the_set_concurrency() -> None:
    bench = load_bench("bench_sandbox")
    seen: list[int] = []
    running = peak = 0

    async def one(i: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        seen.append(i)
        running -= 1

    rate = asyncio.run(bench.drive(50, one))
    assert sorted(seen) == list(range(50))
    assert peak == bench.CONCURRENCY
    assert rate > 0


def test_the_table_has_every_path_ratio_and_goal() -> None:
    bench = load_bench("bench_sandbox")
    ms = 0.001

    def lane(rate: float, latency_ms: float, inside_ms: float | None = None) -> object:
        inside = [] if inside_ms is None else [inside_ms * ms] * 10
        return bench.Lane(rates=[rate], latency=[latency_ms * ms] * 10, inside=inside)

    fig = bench.Figures(
        service=lane(400, 6.0, 4.0),  # added 2 ms
        agent=lane(800, 4.5, 4.0),
        docker=lane(25, 150.0),
        host=lane(100, 40.0),
        cold_start=[0.15, 0.2],
        pool_start=[0.18] * 4,
        max_uses=100,
        image="temper-sandbox:test",
    )
    text = "\n".join(bench.render(fig))
    for name in ("service (NATS", "agent direct", "docker exec", "host spawn", "cold start"):
        assert name in text
    assert "16.0x" in text  # 400 / 25
    assert "PASS  (400/s)" in text
    assert "PASS  (16.0x)" in text
    assert "PASS  (2.00 ms)" in text

    fig.service = lane(200, 9.0, 4.0)  # 8x docker exec, 5 ms added
    text = "\n".join(bench.render(fig))
    assert "MISS  (200/s)" in text
    assert "MISS  (8.0x)" in text
    assert "MISS  (5.00 ms)" in text
