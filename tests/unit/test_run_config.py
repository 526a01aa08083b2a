"""``temper train --config RUN.toml``: the file, the flags over it, every error naming the
file and the key, ``--print-config`` reading back to the same plan, and the feeder's
weighted draw of domains."""

from __future__ import annotations

import json
import random
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from services.cli import build_parser
from services.cli.common import CliError
from services.cli.runconfig import (
    BUILTIN,
    DomainEntry,
    RunConfigError,
    TrainPlan,
    load_domains,
    plan_of,
    to_toml,
)
from services.cli.train import cmd_train
from services.cli.train_policy import mix_identity
from services.domains import load_registry
from services.feeder.mix import DOMAIN_SLACK, domain_bounds, draw_domains

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "runs" / "arithmetic.toml"


def plan(*argv: str) -> TrainPlan:
    return plan_of(build_parser().parse_args(["train", *argv]))


def write(folder: Path, text: str, name: str = "run.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the file and the flags


def test_without_a_config_the_flags_keep_their_defaults(tmp_path: Path) -> None:
    got = plan()
    assert got.domains == (DomainEntry(name="arithmetic_sum4", weight=1.0, source=BUILTIN),)
    assert (got.minutes, got.max_steps, got.group, got.in_flight) == (10.0, 0, 8, 64)
    assert (got.batch, got.minibatches, got.lr, got.lr_decay_steps) == (256, 2, 3e-4, 600)
    assert (got.max_staleness, got.warmup_steps, got.warmup_target) == (2, 600, 0.25)
    assert (got.eval_every, got.eval_samples, got.eval_domains) == (40, 4, ("arithmetic_sum4",))
    assert got.run_dir == Path("run/train").resolve() and got.nats_port == 4223
    assert got.model is None
    # The commented example is today's defaults written out.
    assert plan("--config", str(EXAMPLE)) == got
    legacy = plan("--domain", "arithmetic", "--minutes", "3", "--run-dir", str(tmp_path))
    assert legacy.domain_names == ("arithmetic",) and legacy.eval_domains == ("arithmetic",)
    assert legacy.minutes == 3.0 and legacy.run_dir == tmp_path


def test_the_file_sets_every_table_and_relative_sources_come_from_its_folder(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "qa.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    config = write(
        tmp_path,
        """
        max_staleness = 1
        seed = 7
        [[domains]]
        name = "arithmetic"
        weight = 3
        [[domains]]
        name = "qa"
        source = "data/qa.jsonl"
        params = { validator = "math" }
        [learner]
        lr = 1e-3
        group = 4
        [feeder]
        in_flight = 16
        [budget]
        minutes = 0
        max_steps = 20
        [eval]
        domains = ["arithmetic_sum3"]
        every = 5
        samples = 0
        problems = 30
        [warmup]
        steps = 10
        target = 0
        """.replace("\n        ", "\n"),
    )
    got = plan("--config", str(config))
    assert got.domains == (
        DomainEntry(name="arithmetic", weight=3.0),
        DomainEntry(name="qa", source=str(data / "qa.jsonl"), params={"validator": "math"}),
    )
    assert (got.max_staleness, got.seed, got.lr, got.group, got.in_flight) == (1, 7, 1e-3, 4, 16)
    assert (got.minutes, got.max_steps) == (0.0, 20)
    assert (got.eval_domains, got.eval_every, got.eval_samples, got.eval_problems) == (
        ("arithmetic_sum3",),
        5,
        0,
        30,
    )
    assert (got.warmup_steps, got.warmup_target) == (10, 0.0)


def test_a_flag_given_wins_over_the_file_and_the_rest_of_the_file_stays(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        '[[domains]]\nname = "arithmetic"\n[learner]\nlr = 1e-3\nbatch = 64\n',
    )
    got = plan("--config", str(config), "--lr", "5e-4", "--domain", "arithmetic_sum3=2")
    assert got.lr == 5e-4 and got.batch == 64
    assert got.domains == (DomainEntry(name="arithmetic_sum3", weight=2.0),)
    assert got.eval_domains == ("arithmetic_sum3",)
    assert plan("--config", str(config)).lr == 1e-3


def test_a_given_model_starts_as_it_is_without_a_warm_up(tmp_path: Path) -> None:
    model = tmp_path / "policy"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = write(tmp_path, 'model = "policy"\n')
    got = plan("--config", str(config))
    assert got.model == model and got.warmup_steps == 0


# ---------------------------------------------------------------- errors: file, key, allowed

ERRORS = [
    ("lr = 1\n", "lr: unknown key (allowed: model, run_dir"),
    ("[learner]\nlrr = 1\n", "learner.lrr: unknown key (allowed in [learner]: lr,"),
    ("[learner]\nlr = -1\n", "learner.lr: -1 is not allowed (> 0)"),
    ('[learner]\nlr = "fast"\n', "learner.lr: must be a number, not 'fast'"),
    ("[learner]\nbatch = 2.5\n", "learner.batch: must be a whole number, not 2.5"),
    ("[learner]\ngroup = true\n", "learner.group: must be a whole number, not True"),
    ("[learner]\ngroup = 0\n", "learner.group: 0 is not allowed (a whole number >= 1)"),
    ("learner = 3\n", "learner: must be a table ([learner])"),
    ("[warmup]\ntarget = 1.5\n", "warmup.target: 1.5 is not allowed (a number in [0, 1])"),
    ("[warmup]\nrecovery_share = 2\n", "warmup.recovery_share: 2 is not allowed (a number in"),
    ("[warmup]\nrecovery_steps = -1\n", "warmup.recovery_steps: -1 is not allowed (a whole"),
    ("nats_port = 70000\n", "nats_port: 70000 is not allowed (1..65535)"),
    ("[budget]\nminutes = 0\n", "budget.minutes: 0 with budget.max_steps = 0"),
    ("[instances]\ngenerator = 2\n", "instances.generator: 2: the embedded stack runs one"),
    ("[instances]\nvalidator = 3\n", "instances.validator: 3: the embedded stack runs one"),
    ('[[domains]]\nname = "arithmetic"\nweight = 0\n', "domains[0].weight: 0 is not allowed"),
    ('[[domains]]\nname = "arithmetic"\nweight = -2\n', "domains[0].weight: -2 is not allowed"),
    ('[[domains]]\nname = "a.b"\n', "domains[0].name: 'a.b' is not a domain name"),
    ("[[domains]]\nweight = 1\n", "domains[0].name: is required"),
    ('[[domains]]\nname = "arithmetic"\nsize = 1\n', "domains[0].size: unknown key"),
    ('[[domains]]\nname = "x"\nsource = "nowhere.toml"\n', "domains[0].source: "),
    (
        '[[domains]]\nname = "arithmetic"\nparams = { style = "boxed" }\n',
        "domains[0].params: only a JSONL source takes params",
    ),
    (
        '[[domains]]\nname = "arithmetic"\n[[domains]]\nname = "arithmetic"\n',
        "domains[1].name: 'arithmetic' is named twice",
    ),
    ('model = "no-model-here"\n', "model: "),
    ("domains = 3\n", "domains: must be one or more [[domains]] tables"),
    ("[eval]\ndomains = []\n", "eval.domains: must be a non-empty list of domain names"),
    ("[learner\n", "not valid TOML"),
]


@pytest.mark.parametrize(("text", "expected"), ERRORS)
def test_a_bad_file_names_itself_the_key_and_what_is_allowed(
    tmp_path: Path, text: str, expected: str
) -> None:
    config = write(tmp_path, text)
    (tmp_path / "no-model-here").mkdir()
    with pytest.raises(RunConfigError) as caught:
        plan("--config", str(config))
    message = str(caught.value)
    assert message.startswith(f"{config}: "), message
    assert expected in message, message


def test_a_model_directory_without_config_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    config = write(tmp_path, 'model = "empty"\n')
    with pytest.raises(RunConfigError, match=r"model: .*empty is not a model directory"):
        plan("--config", str(config))


@pytest.mark.parametrize(
    ("warmup", "expected"),
    [
        ("steps = 5\n", r"run.toml: warmup.steps: 5: the supervised"),
        ("steps = 0\nrecovery_steps = 5\n", r"run.toml: warmup.recovery_steps: 5: the recovery"),
    ],
)
def test_warm_up_steps_with_a_given_model_are_refused(
    tmp_path: Path, warmup: str, expected: str
) -> None:
    model = tmp_path / "policy"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = write(tmp_path, f'model = "policy"\n[warmup]\n{warmup}')
    with pytest.raises(RunConfigError, match=expected):
        plan("--config", str(config))


def test_recovery_steps_need_a_tool_domain_in_the_mix(tmp_path: Path) -> None:
    config = write(tmp_path, '[[domains]]\nname = "arithmetic"\n[warmup]\nrecovery_steps = 5\n')
    with pytest.raises(RunConfigError) as caught:
        load_domains(plan("--config", str(config)), tmp_path / "out")
    assert str(caught.value).startswith(f"{config}: warmup.recovery_steps: 5: no domain of the")
    assert "(arithmetic)" in str(caught.value)
    with pytest.raises(RunConfigError, match=r"command line: --warmup-recovery-steps: 3: no"):
        load_domains(plan("--warmup-recovery-steps", "3"), tmp_path / "out")
    tools = plan("--domain", "tool_use", "--domain", "arithmetic", "--warmup-recovery-steps", "3")
    assert load_domains(tools, tmp_path / "out").names == ("tool_use", "arithmetic")


def test_bad_flags_name_the_flag(tmp_path: Path) -> None:
    for argv, expected in [
        (["--lr", "-1"], "command line: --lr: -1.0 is not allowed (> 0)"),
        (["--domain", "arithmetic=0"], "command line: --domain arithmetic=0: 0.0 is not"),
        (["--domain", "a=b"], "--domain a=b: must be a number > 0, not 'b'"),
        (["--generators", "2"], "command line: --generators: 2: the embedded stack runs one"),
        (["--model", str(tmp_path)], "command line: --model: "),
    ]:
        with pytest.raises(RunConfigError) as caught:
            plan(*argv)
        assert expected in str(caught.value), (argv, str(caught.value))


def _domains_error(tmp_path: Path, text: str) -> str:
    config = write(tmp_path, text)
    with pytest.raises(RunConfigError) as caught:
        load_domains(plan("--config", str(config)), tmp_path / "out")
    return str(caught.value)


def test_an_unknown_domain_names_the_file_the_entry_and_the_source(tmp_path: Path) -> None:
    message = _domains_error(
        tmp_path, '[[domains]]\nname = "arithmetic"\n[[domains]]\nname = "nope"\n'
    )
    assert message.startswith(f"{tmp_path / 'run.toml'}: domains[1].name: unknown domain 'nope'")
    assert "built-in domains" in message and "temper domains --local" in message
    message = _domains_error(tmp_path, '[eval]\ndomains = ["arithmetic", "nope"]\n')
    assert message.startswith(f"{tmp_path / 'run.toml'}: eval.domains: unknown domain 'nope'")


def test_a_jsonl_file_with_a_bad_line_names_the_file_and_line(tmp_path: Path) -> None:
    lines = ['{"question": "1+1", "answer": "2"}', '{"question": "2+2"}', "not json"]
    (tmp_path / "qa.jsonl").write_text("\n".join(lines) + "\n")
    message = _domains_error(tmp_path, '[[domains]]\nname = "qa"\nsource = "qa.jsonl"\n')
    assert message.startswith(f"{tmp_path / 'run.toml'}: domains[0].source: ")
    assert f"{tmp_path / 'qa.jsonl'}:2: `question` and `answer` must be strings" in message


def test_the_command_stops_with_exit_code_2_before_anything_starts(tmp_path: Path) -> None:
    config = write(tmp_path, "[learner]\nlr = 0\n")
    args = build_parser().parse_args(
        ["train", "--config", str(config), "--run-dir", str(tmp_path / "r")]
    )
    with pytest.raises(CliError) as caught:
        cmd_train(args)
    assert caught.value.exit_code == 2 and "learner.lr: 0 is not allowed" in str(caught.value)
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- domains from several sources


def test_sources_combine_into_one_domains_config_for_the_services(tmp_path: Path) -> None:
    """A config file's relative paths still point at its data once the run copies it."""
    deck = tmp_path / "deck"
    (deck / "data").mkdir(parents=True)
    (deck / "data" / "units.jsonl").write_text('{"question": "1 km in m?", "answer": "1000"}\n')
    (deck / "domains.toml").write_text(
        '[[domain]]\nname = "units"\nkind = "jsonl"\nparams = { path = "data/units.jsonl" }\n'
    )
    (tmp_path / "qa.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    config = write(
        tmp_path,
        '[[domains]]\nname = "arithmetic"\n'
        '[[domains]]\nname = "units"\nsource = "deck"\nweight = 2\n'
        '[[domains]]\nname = "qa"\nsource = "qa.jsonl"\nparams = { style = "boxed" }\n',
    )
    domains = load_domains(plan("--config", str(config)), tmp_path / "run" / "domains")
    assert [(d.name, w) for d, w in domains.train] == [
        ("arithmetic", 1.0),
        ("units", 2.0),
        ("qa", 1.0),
    ]
    assert domains.config == tmp_path / "run" / "domains"
    served = load_registry(domains.config)
    assert {"arithmetic", "arithmetic_sum3", "units", "qa"} <= set(served.names())
    units = served.get("units").problems(1, split="train", seed=0)[0]
    assert units.metadata["answer"] == "1000"
    assert served.get("qa").validators == domains.train[2][0].validators


def test_built_in_domains_alone_need_no_domains_config(tmp_path: Path) -> None:
    domains = load_domains(plan("--domain", "arithmetic", "--eval-domains", "tool_use"), tmp_path)
    assert domains.config is None
    assert [d.name for d in domains.eval] == ["tool_use"]


def test_sources_that_declare_a_name_twice_are_refused(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write(
            tmp_path,
            f'[[domain]]\nname = "dup"\nkind = "arithmetic"\n'
            f'[[domain]]\nname = "{name}"\nkind = "arithmetic"\n',
            f"{name}.toml",
        )
    config = write(
        tmp_path,
        '[[domains]]\nname = "a"\nsource = "a.toml"\n[[domains]]\nname = "b"\nsource = "b.toml"\n',
    )
    with pytest.raises(RunConfigError, match=r"domains: the sources do not combine: .*'dup'"):
        load_domains(plan("--config", str(config)), tmp_path / "out")


# ---------------------------------------------------------------- --print-config


def test_print_config_reads_back_to_the_same_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "policy"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "qa.jsonl").write_text('{"question": "say \\"hi\\"", "answer": "hi"}\n')
    config = write(
        tmp_path,
        'model = "policy"\nseed = 3\n[[domains]]\nname = "arithmetic"\nweight = 0.25\n'
        '[[domains]]\nname = "qa"\nsource = "qa.jsonl"\nparams = { validator = "math" }\n'
        "[eval]\nevery = 0\n",
    )
    argv = ["--config", str(config), "--lr", "2e-5", "--eval-domains", "arithmetic,tool_use"]
    args = build_parser().parse_args(["train", *argv, "--print-config"])
    assert cmd_train(args) == 0
    printed = capsys.readouterr().out
    tomllib.loads(printed)  # valid TOML
    expected = plan(*argv)
    # Read back from elsewhere: every path in it is absolute.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    again = plan("--config", str(write(elsewhere, printed, "printed.toml")))
    assert again == expected
    assert (
        again.lr == 2e-5
        and again.model == model
        and again.domains[1].params == {"validator": "math"}
    )
    assert to_toml(again) == printed


def test_print_config_prints_the_defaults_as_a_config(tmp_path: Path) -> None:
    text = to_toml(plan())
    data = tomllib.loads(text)
    assert data["domains"] == [{"name": "arithmetic_sum4", "weight": 1.0, "source": "builtin"}]
    assert data["learner"] == {
        "lr": 3e-4,
        "lr_decay_steps": 600,
        "batch": 256,
        "minibatches": 2,
        "group": 8,
    }
    assert "model" not in data
    assert data["warmup"] == {
        "steps": 600,
        "target": 0.25,
        "recovery_steps": 0,
        "recovery_share": 0.5,
    }


# ---------------------------------------------------------------- the feeder's draw


def test_the_draw_follows_the_weights() -> None:
    weights = {"a": 3.0, "b": 1.0, "c": 0.5}
    unbounded = dict.fromkeys(weights, 10**9)
    drawn = draw_domains(45_000, weights, {}, unbounded, random.Random(0))
    shares = {name: count / len(drawn) for name, count in Counter(drawn).items()}
    total = sum(weights.values())
    for name, weight in weights.items():
        assert shares[name] == pytest.approx(weight / total, abs=0.01), shares


def test_the_draw_is_the_same_under_the_same_seed() -> None:
    weights = {"a": 1.0, "b": 2.0}
    bounds = dict.fromkeys(weights, 100)
    first = draw_domains(50, weights, {"a": 3}, bounds, random.Random(5))
    assert first == draw_domains(50, weights, {"a": 3}, bounds, random.Random(5))
    assert first != draw_domains(50, weights, {"a": 3}, bounds, random.Random(6))


def test_a_domain_at_its_in_flight_bound_is_skipped() -> None:
    weights = {"slow": 1.0, "fast": 1.0}
    bounds = domain_bounds(8, weights)
    assert bounds == {"slow": 6, "fast": 6}  # 1.5 x its half of 8
    drawn = draw_domains(8, weights, {"slow": 6}, bounds, random.Random(0))
    assert drawn == ["fast"] * 6, "slow is full, fast fills only to its own bound"
    assert draw_domains(4, weights, {"slow": 6, "fast": 6}, bounds, random.Random(0)) == []
    tiny = domain_bounds(4, {"big": 99.0, "small": 1.0})
    assert tiny["small"] == 1 and tiny["big"] == int(DOMAIN_SLACK * 4 * 0.99) + 1


# ---------------------------------------------------------------- the start policy's recipe


def test_the_warm_start_recipe_covers_every_domain_and_weight(tmp_path: Path) -> None:
    one = plan()
    single = load_domains(one, tmp_path / "1")
    # One built-in domain: the key of the runs before mixes, so their cached start is found.
    assert mix_identity(one, single.train) == ["arithmetic_sum4"]
    mixed = plan("--domain", "arithmetic=2", "--domain", "arithmetic_sum3")
    identity = mix_identity(mixed, load_domains(mixed, tmp_path / "2").train)
    reweighted = plan("--domain", "arithmetic=1", "--domain", "arithmetic_sum3")
    assert identity == ["arithmetic", "arithmetic_sum3", [2.0, 1.0]]
    assert identity != mix_identity(reweighted, load_domains(reweighted, tmp_path / "3").train)
    (tmp_path / "qa.jsonl").write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    jsonl = plan("--domain", f"qa@{tmp_path / 'qa.jsonl'}")
    before = mix_identity(jsonl, load_domains(jsonl, tmp_path / "4").train)
    (tmp_path / "qa.jsonl").write_text(json.dumps({"question": "q", "answer": "b"}) + "\n")
    after = mix_identity(jsonl, load_domains(jsonl, tmp_path / "5").train)
    assert before != after, "a JSONL domain's data is part of the recipe"


# ---------------------------------------------------------------- the warm-up's mix


def test_the_warm_up_shares_its_examples_out_by_weight() -> None:
    from services.model.sft import mixed_examples, shares

    assert shares(4096, [1.0]) == [4096]
    assert shares(10, [3.0, 1.0, 1.0]) == [6, 2, 2]
    assert shares(10, [1.0, 1.0, 1.0]) == [4, 3, 3]
    assert shares(4, [100.0, 0.01]) == [3, 1], "every domain of the mix gets an example"
    registry = load_registry(None)
    mix = [(registry.get("arithmetic"), 3.0), (registry.get("arithmetic_sum3"), 1.0)]
    examples = mixed_examples(mix, 40, seed=0)
    assert Counter(e.task.domain for e in examples) == {"arithmetic": 30, "arithmetic_sum3": 10}
    assert all(e.task.metadata["split"] == "train" for e in examples)
    single = mixed_examples(mix[:1], 40, seed=0)
    assert [e.task for e in single] == mix[0][0].make_tasks(40, split="train", seed=0)


# ---------------------------------------------------------------- what the user sees


def test_the_summary_shows_the_macro_average_and_each_domain() -> None:
    from services.cli.train_view import heldout_lines, summary
    from services.evaluation.heldout import macro_average
    from services.evaluation.runner import RoundResult

    def round_(version: int, a: float, b: float) -> RoundResult:
        figures = {"sampled_accuracy": 0.1, "chance": 0.1, "failed": 0}
        lines = tuple(
            {
                "domain": name,
                "version": version,
                "elapsed_s": 1.0,
                "greedy_accuracy": value,
                "pass_at_4": value + 0.2,
                "problems": 10,
                "samples": 4,
                **figures,
            }
            for name, value in (("a", a), ("b", b))
        )
        return RoundResult(domains=lines, headline=macro_average(list(lines), version))

    start, end = round_(0, 0.2, 0.4), round_(9, 0.6, 0.4)
    shown = summary([], [start, end])
    assert "macro-averaged held-out greedy accuracy 30.0% (v0) -> 50.0% (v9): +20.0" in shown[1]
    assert shown[2].startswith("  a: greedy accuracy 20.0% (v0) -> 60.0% (v9): +40.0")
    assert shown[3].startswith("  b: greedy accuracy 40.0% (v0) -> 40.0% (v9): +0.0")
    # pass@k beside greedy, per domain: where RL has room to raise greedy accuracy.
    assert "; pass@4 40.0% -> 80.0%;" in shown[2] and "; pass@4 60.0% -> 60.0%;" in shown[3]
    lines = heldout_lines(end)
    assert lines[0].startswith("held-out (macro average) v9 at 1 s: greedy 50.0%")
    assert lines[1].startswith("  a: greedy 60.0%") and lines[2].startswith("  b: greedy 40.0%")


def test_up_with_a_run_config_starts_the_feeder_on_its_mix(tmp_path: Path) -> None:
    from services import registry
    from services.cli.train import up_env

    args = build_parser().parse_args(["up", "--config", "run.toml"])
    assert args.config == Path("run.toml")
    config = tmp_path / "run.toml"
    config.write_text(
        '[[domains]]\nname = "arithmetic_sum4"\nweight = 3\n\n'
        '[[domains]]\nname = "arithmetic"\n\n[feeder]\nin_flight = 12\n'
    )
    env = up_env(config, tmp_path / "run")
    assert env["TEMPER_FEEDER_MIX"] == "arithmetic_sum4=3.0,arithmetic=1.0"
    assert env["TEMPER_FEEDER_IN_FLIGHT"] == "12"
    assert env["TEMPER_FEEDER_STATE_DIR"] == str(tmp_path / "run" / "feeder")
    assert "feeder" in registry.default_services(env)
    config.write_text('[[domains]]\nname = "no_such_domain"\n')
    with pytest.raises(CliError, match=r"run\.toml.*no_such_domain") as refused:
        up_env(config, tmp_path / "run")
    assert refused.value.exit_code == 2


# ---------------------------------------------------------------- the mix run


MIX = REPO / "deploy" / "runs" / "mix.toml"


def test_the_mix_run_trains_six_domains_of_three_kinds_each_with_a_heldout_split(
    tmp_path: Path,
) -> None:
    mix = plan("--config", str(MIX), "--run-dir", str(tmp_path))
    domains = load_domains(mix, tmp_path / "domains")
    kinds = Counter(domain.kind for domain, _ in domains.train)
    assert len(domains.train) >= 6 and len(kinds) >= 3, kinds
    assert "reasoning_gym" in kinds and "jsonl" in kinds
    assert [d.name for d in domains.eval] == list(domains.names)
    for domain, _ in domains.train:
        keys = {p.key for p in domain.problems(2000, "eval", seed=0)}
        trained = {p.key for p in domain.problems(2000, "train", seed=0)}
        assert len(keys) >= 30 and not keys & trained, domain.name


def test_the_stories_file_is_what_its_script_writes() -> None:
    import importlib.util

    script = REPO / "deploy" / "runs" / "data" / "make_stories.py"
    spec = importlib.util.spec_from_file_location("make_stories", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = script.with_name("stories.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines == module.stories()
    # The id is the arithmetic (a+b-c): a sum is never both trained on and held out.
    for line in lines:
        a, b, c = map(int, line["id"].replace("-", "+").split("+"))
        assert a + b - c == int(line["answer"]) and f"{a} " in line["question"]


def test_the_feeder_table_sets_its_filter_and_pools_and_rejects_an_unknown_filter(
    tmp_path: Path,
) -> None:
    from services.cli.train import up_env

    config = write(
        tmp_path,
        '[feeder]\nfilter = "later"\neasy_take = 0.1\nhard_take = 1.0\n',
    )
    got = plan("--config", str(config))
    assert (got.feeder_filter, got.easy_take, got.hard_take) == ("later", 0.1, 1.0)
    assert plan("--config", str(config), "--feeder-filter", "skip").feeder_filter == "skip"
    env = up_env(config, tmp_path / "run")
    assert env["TEMPER_FEEDER_FILTER"] == "later" and env["TEMPER_FEEDER_EASY_TAKE"] == "0.1"
    assert tomllib.loads(to_toml(got))["feeder"]["filter"] == "later"
    bad = write(tmp_path, '[feeder]\nfilter = "drop"\n', "bad.toml")
    with pytest.raises(RunConfigError) as error:
        plan("--config", str(bad))
    assert error.value.key == "feeder.filter" and '"count" or "skip" or "later"' in str(error.value)
    wrong = write(tmp_path, "[feeder]\nfilter = 3\n", "wrong.toml")
    with pytest.raises(RunConfigError, match=r"feeder\.filter: must be a string, not 3"):
        plan("--config", str(wrong))
