"""``temper train``'s start policy: warmed once per recipe in the model cache, then copied;
a given model directory is used as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli import build_parser, train_policy
from services.cli.runconfig import RunDomains, TrainPlan, load_domains, plan_of
from services.cli.train import prepare_policy
from services.cli.train_policy import recovery_mix


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


def test_the_recovery_stage_starts_from_the_cached_warm_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    warmed: list[Path] = []
    recovered: list[tuple[Path, int]] = []

    def warm_up(plan: TrainPlan, domains: RunDomains, config: object, model: Path) -> None:
        warmed.append(model)
        model.mkdir()
        (model / "config.json").write_text('{"stage": 1}')

    def recover(
        plan: TrainPlan, domains: RunDomains, config: object, start: Path, model: Path
    ) -> None:
        assert (start / "config.json").read_text() == '{"stage": 1}'
        recovered.append((start, plan.warmup_recovery_steps))
        model.mkdir()
        (model / "config.json").write_text(f'{{"stage": 2, "steps": {plan.warmup_recovery_steps}}}')

    monkeypatch.setattr(train_policy, "_warm_up", warm_up)
    monkeypatch.setattr(train_policy, "_recover", recover)

    def prepare(run_dir: Path, *argv: str) -> str:
        chosen = plan(run_dir, "--domain", "tool_use", *argv)
        return (
            prepare_policy(chosen, load_domains(chosen, run_dir / "domains")) / "config.json"
        ).read_text()

    assert prepare(tmp_path / "a") == '{"stage": 1}'
    assert prepare(tmp_path / "b", "--warmup-recovery-steps", "4") == '{"stage": 2, "steps": 4}'
    assert prepare(tmp_path / "c", "--warmup-recovery-steps", "4") == '{"stage": 2, "steps": 4}'
    assert len(warmed) == 1 and len(recovered) == 1, "each stage is built once per recipe"
    assert recovered[0][0].parent == tmp_path / "cache", "from the cached plain warm-up"
    prepare(tmp_path / "d", "--warmup-recovery-steps", "4", "--warmup-recovery-share", "0.2")
    prepare(tmp_path / "e", "--warmup-recovery-steps", "6")
    assert len(warmed) == 1 and len(recovered) == 3, "another share or length: another stage"


def test_the_recovery_mix_shows_failed_calls_in_the_tool_domains_only(tmp_path: Path) -> None:
    chosen = plan(tmp_path, "--domain", "tool_use", "--domain", "arithmetic")
    mix = load_domains(chosen, tmp_path / "domains").train
    (tools, tool_weight), (arithmetic, weight) = recovery_mix(mix, 1.0)
    assert arithmetic is mix[1][0] and (tool_weight, weight) == (1.0, 1.0)
    before = mix[0][0].examples(20, seed=1)
    tools_examples = tools.examples(20, seed=1)
    assert [e.task.id for e in tools_examples] == [e.task.id for e in before]
    assert all(
        len(e.tool_outputs) == len(b.tool_outputs) + 1
        for e, b in zip(tools_examples, before, strict=True)
    )
    assert all("NameError" in e.tool_outputs[0] for e in tools_examples)
