"""The codec benchmark keeps running (its figures are printed, never asserted)."""

from __future__ import annotations

import pytest

from tests.benches import load_bench


def test_bench_workload_is_consistent() -> None:
    work = load_bench("bench_codec").workload()
    rollout = work.rollout
    assert len(rollout.token_ids) == 4_000
    assert rollout.prompt_len == 2_000
    assert len(rollout.behaviour_logprobs) == len(rollout.mask) == 2_000
    assert work.baseline["tokens"] == rollout.token_ids.tolist()
    assert work.baseline["loss_mask"] == rollout.mask.tolist()


def test_bench_main_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_bench("bench_codec").main(batches=1, repeats=1) == 0
    out = capsys.readouterr().out
    assert "protocol.Codec" in out
    assert "msgpack + lists" in out
    assert "goal: <= 10 µs each way:" in out
