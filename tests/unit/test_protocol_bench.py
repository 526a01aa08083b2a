"""The codec benchmark keeps running (its figures are printed, never asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_codec.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_codec", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the module executes.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_workload_is_consistent() -> None:
    work = load_bench().workload()
    rollout = work.rollout
    assert len(rollout.token_ids) == 4_000
    assert rollout.prompt_len == 2_000
    assert len(rollout.behaviour_logprobs) == len(rollout.mask) == 2_000
    assert work.baseline["tokens"] == rollout.token_ids.tolist()
    assert work.baseline["loss_mask"] == rollout.mask.tolist()


def test_bench_main_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_bench().main(batches=1, repeats=1) == 0
    out = capsys.readouterr().out
    assert "protocol.Codec" in out
    assert "msgpack + lists" in out
    assert "goal: <= 10 µs each way:" in out
