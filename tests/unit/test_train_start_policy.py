"""``temper train``'s start policy: warmed once per recipe in the model cache, then copied."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from services.cli import train
from services.cli.train import TrainPlan, prepare_policy


def plan(run_dir: Path, **changes: object) -> TrainPlan:
    base = TrainPlan(
        run_dir=run_dir,
        nats_port=0,
        domain="arithmetic_sum3",
        minutes=1.0,
        max_steps=0,
        group=4,
        in_flight=8,
        batch=8,
        minibatches=1,
        lr=1e-4,
        lr_decay_steps=0,
        max_staleness=1,
        warmup_steps=2,
        warmup_target=0.0,
        eval_every=0,
        eval_samples=0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_warm_start_is_built_once_per_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    built: list[Path] = []

    def build(plan: TrainPlan, domain: object, config: object, model: Path) -> None:
        """The warm-up itself runs in tests/integration/test_cli_train.py."""
        built.append(model)
        model.mkdir()
        (model / "config.json").write_text(f'{{"built": {len(built)}}}')

    monkeypatch.setattr(train, "_warm_up", build)
    first = prepare_policy(plan(tmp_path / "a"))
    second = prepare_policy(plan(tmp_path / "b"))
    assert len(built) == 1, "the second run copies the cached start"
    assert (first / "config.json").read_text() == (second / "config.json").read_text()
    assert first == tmp_path / "a" / "model" and second == tmp_path / "b" / "model"
    prepare_policy(plan(tmp_path / "c", warmup_steps=3))
    assert len(built) == 2, "another warm-up is another recipe"
