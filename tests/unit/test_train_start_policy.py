"""``temper train``'s start policy: warmed once per recipe in the model cache, then copied;
a given model directory is used as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli import build_parser, train_policy
from services.cli.runconfig import RunDomains, TrainPlan, load_domains, plan_of
from services.cli.train import prepare_policy


def plan(run_dir: Path, *argv: str) -> TrainPlan:
    args = ["train", "--run-dir", str(run_dir), "--warmup-steps", "2", "--warmup-target", "0"]
    return plan_of(build_parser().parse_args([*args, *argv]))


def test_the_warm_start_is_built_once_per_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    built: list[tuple[str, ...]] = []

    def build(plan: TrainPlan, domains: RunDomains, config: object, model: Path) -> None:
        """The warm-up itself runs in tests/integration/test_cli_train.py."""
        built.append(domains.names)
        model.mkdir()
        (model / "config.json").write_text(f'{{"built": {len(built)}}}')

    def prepare(run_dir: Path, *argv: str) -> Path:
        chosen = plan(run_dir, *argv)
        return prepare_policy(chosen, load_domains(chosen, run_dir / "domains"))

    monkeypatch.setattr(train_policy, "_warm_up", build)
    first = prepare(tmp_path / "a")
    second = prepare(tmp_path / "b")
    assert len(built) == 1, "the second run copies the cached start"
    assert (first / "config.json").read_text() == (second / "config.json").read_text()
    assert first == tmp_path / "a" / "model" and second == tmp_path / "b" / "model"
    prepare(tmp_path / "c", "--warmup-steps", "3")
    assert len(built) == 2, "another warm-up is another recipe"
    mix = ("--domain", "arithmetic_sum3", "--domain", "arithmetic=0.5")
    prepare(tmp_path / "d", *mix)
    assert built[-1] == ("arithmetic_sum3", "arithmetic"), "the warm-up gets the whole mix"
    prepare(tmp_path / "e", "--domain", "arithmetic_sum3", "--domain", "arithmetic=2")
    assert len(built) == 4, "other weights are another recipe"


def test_a_given_model_is_the_start_policy(tmp_path: Path) -> None:
    model = tmp_path / "policy"
    model.mkdir()
    (model / "config.json").write_text("{}")
    chosen = plan_of(build_parser().parse_args(["train", "--model", str(model)]))
    assert prepare_policy(chosen, load_domains(chosen, tmp_path / "domains")) == model
