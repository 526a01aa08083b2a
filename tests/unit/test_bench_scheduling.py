"""bench/bench_scheduling.py's report and policy recipe, without a generator (its figures
are printed, never asserted; tests/integration/test_bench_scheduling_smoke.py runs it)."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.benches import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("bench_scheduling")


def lane(bench: ModuleType, preemption: bool, queue_ms: float, **stats: float) -> object:
    queued = [queue_ms / 1000 * (1 + i / 10) for i in range(10)]  # p50 1.4x, p95 1.9x
    return bench.Lane(
        preemption=preemption,
        queued=queued,
        published=[q + 0.1 for q in queued],
        generating=[0.08] * 10,
        low_trajectories=4,
        low_turns=32,
        low_generate_s=3.2,  # 0.1 s a turn
        wall_s=10.0,
        busy=0.95,
        stats=stats,
    )


def test_the_report_has_both_sides_the_ratio_and_the_overhead(bench: ModuleType) -> None:
    on_stats = {
        "preemptions": 4.0,
        "resumes": 4.0,
        "time_preempt_save_s": 0.02,
        "count_preempt_save": 4.0,
        "time_preempt_restore_s": 0.06,
        "count_preempt_restore": 4.0,
    }
    rounds = [
        [lane(bench, False, 500), lane(bench, True, 50, **on_stats)],
        [lane(bench, True, 100, **on_stats), lane(bench, False, 400)],
    ]
    text = "\n".join(bench.render(rounds, bench.Workload()))
    assert "repeat 1 (off first)" in text and "repeat 2 (on first)" in text
    assert "p95 queue off/on: 10.0x" in text and "p95 queue off/on: 4.0x" in text
    assert "high-tier p95 queue off/on: 4.0-10.0x (median 7.0x; goal >= 5x)  PASS" in text
    assert "preemption off: high-tier queue p50 560-700 ms" in text
    assert "preemption on: high-tier queue p50 70-140 ms" in text
    # (0.02 + 0.06) / 4 preempted = 20 ms, against 100 ms turns.
    assert "(save + restore): 20.00-20.00 ms vs a plain turn 100-100 ms (20.0-20.0% of a turn)" in (
        text
    )
    assert "save 5.00-5.00 ms, restore 15.00-15.00 ms each; preempted 8, resumed 8" in text
    assert "8.0 turns each" in text and "slots in use 95.0-95.0% of the time" in text


def test_a_build_without_preemption_reports_the_off_side_alone(bench: ModuleType) -> None:
    note = "preemption on: not in this build"
    text = "\n".join(bench.render([[lane(bench, False, 500)]], bench.Workload(), note))
    assert note in text
    assert "preemption off: high-tier queue p50 700-700 ms" in text
    assert "preemption on: not measured" in text
    assert "off/on" not in text


def test_the_warm_up_teaches_calling_again_after_each_output(bench: ModuleType) -> None:
    examples = bench.tool_domain().examples(40, seed=1)
    depths = {sum(m.role == "tool" for m in e.task.prompt) for e in examples}
    assert min(depths) == 0 and max(depths) <= 7 and len(depths) > 3
    for example in examples:
        assert example.reference.startswith("<tool_call>") and "<answer>" not in example.reference
        calls = [m.content for m in example.task.prompt if m.role == "assistant"]
        assert all(call == example.reference for call in calls)


def test_the_sandbox_snapshot_lines_set_save_and_restore_against_a_turn() -> None:
    snapshots = load_bench("scheduling_sandbox")
    fig = snapshots.SnapshotFigures(
        image="temper-sandbox:x",
        turn_s=[0.010, 0.010, 0.012],
        fresh_s=[0.020],
        save_s=[0.008, 0.009],
        restore_s=[0.022, 0.023],
    )
    text = "\n".join(snapshots.render(fig))
    assert "save p50 8 ms (max 9); restore (first turn from the snapshot) p50 22 ms" in text
    # save 8.5 + restore 22.5 - the turn a resumed trajectory would have run anyway 10
    assert "overhead per trajectory: 21 ms (2.1 plain tool turns)" in text
    assert "work intact after restore: yes" in text
    fig.intact = False
    assert "work intact after restore: NO" in "\n".join(snapshots.render(fig))
    skipped = snapshots.SnapshotFigures(skipped="no Docker")
    assert snapshots.render(skipped) == ["  real sandbox snapshot: not measured (no Docker)"]
