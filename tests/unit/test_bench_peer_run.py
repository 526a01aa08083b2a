"""The TRL side-by-side benchmarks' plumbing (bench/peer_run.py, peer_report.py,
bench_mix.py, bench_agentic.py); their figures are printed, never asserted, and their runs
are too long for a test."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from services.domains import load_registry
from services.evaluation.heldout import HeldoutSet
from services.feeder.dataset import Dataset
from services.feeder.settings import FeederSettings
from tests.benches import load_bench


def test_the_mix_is_shared_out_by_weight() -> None:
    rows_per_domain = load_bench("bench_mix").rows_per_domain
    assert rows_per_domain([1.0, 1.0, 2.0], 100) == [25, 25, 50]
    assert rows_per_domain([1.0, 0.0001], 100) == [100, 1]


def test_temper_curve_is_the_macro_average_of_each_evaluation(tmp_path: Path) -> None:
    peer = load_bench("peer_run")
    lines = [
        {"evaluation": 1, "domain": "a", "elapsed_s": 0.4, "greedy_accuracy": 0.2},
        {"evaluation": 1, "domain": "b", "elapsed_s": 0.4, "greedy_accuracy": 0.4},
        {"evaluation": 2, "domain": "b", "elapsed_s": 61.0, "greedy_accuracy": 0.8},
        {"evaluation": 2, "domain": "a", "elapsed_s": 61.0, "greedy_accuracy": 0.6},
    ]
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "heldout.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    heldout = peer.temper_heldout(tmp_path)
    assert heldout == [(0.4, {"a": 0.2, "b": 0.4}), (61.0, {"a": 0.6, "b": 0.8})]
    side = peer.Side(
        name="temper", steps=4, batches=2, samples=512, seconds=64.0, rewards=[], heldout=heldout
    )
    assert side.curve == [(0.4, pytest.approx(0.3)), (61.0, pytest.approx(0.7))]
    assert side.rate == 8.0


def test_time_to_peer_is_a_share_of_the_peers_time(capsys: pytest.CaptureFixture[str]) -> None:
    time_to_peer = load_bench("peer_report").time_to_peer
    peer = [(0.0, 0.2), (600.0, 0.5)]
    assert time_to_peer(peer, [(0.0, 0.2), (100.0, 0.4), (200.0, 0.6)], 1, "x") == 200 / 600
    assert time_to_peer(peer, [(0.0, 0.2), (100.0, 0.4)], 1, "x") is None
    assert time_to_peer(peer, [(0.0, 0.9)], 3, "x") is None
    assert "too few evaluations" in capsys.readouterr().out


def test_peer_answers_are_judged_by_the_domains_validators() -> None:
    """TRL's held-out answers pass or fail as Temper's evaluation would judge them: the
    ``math`` validator reads the last answer tag, as a number."""
    peer = load_bench("peer_run")
    domain = load_registry(None).get("arithmetic_sum3")
    heldout = HeldoutSet.of(domain, limit=1)
    problem = heldout.problems[0]
    task = domain.task(problem, "eval", 0, 0)
    scorer = peer.HeldoutScorer([heldout])
    answer = str(problem.metadata["answer"])
    assert scorer.passes(domain, task, f"<answer>{answer}.0</answer>")
    assert scorer.passes(domain, task, f"<answer>x</answer> <answer>{answer}</answer>")
    assert not scorer.passes(domain, task, f"<answer>{answer}</answer> <answer>x</answer>")
    assert not scorer.passes(domain, task, answer)


def test_trl_gets_the_run_configs_learner_settings_and_mix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What bench_mix hands TRL is read from the run config by Temper's own code, and the
    TRL runner's own checks accept it."""
    config = tmp_path / "run.toml"
    config.write_text(
        '[[domains]]\nname = "arithmetic_sum3"\nweight = 1.0\n'
        '[[domains]]\nname = "arithmetic_sum4"\nweight = 3.0\n'
        "[learner]\nlr = 1e-3\nlr_decay_steps = 50\nbatch = 128\nminibatches = 4\ngroup = 4\n"
        "[eval]\nproblems = 7\n"
    )
    bench, peer = load_bench("bench_mix"), load_bench("peer_run")
    mix = peer.read_mix(["--config", str(config)], tmp_path / "domains")
    assert mix.plan.eval_problems == 7
    assert mix.settings == peer.Matched(
        group=4, batch=128, minibatches=4, lr=1e-3, lr_decay_steps=50, max_new_tokens=16
    )
    monkeypatch.setattr(bench, "TRL_ROWS", 400)
    rows = bench.trl_rows(mix.domains, mix.plan.seed)
    assert [sum(r["domain"] == name for r in rows) for name in mix.domains.names] == [100, 300]
    # TRL's rows are the problems the feeder asks, in the spellings it asks them.
    domain = mix.domains.train[1][0]
    feeder = Dataset.of(domain, FeederSettings().dataset_size, mix.plan.seed)
    asked = [feeder.spelling(i, epoch) for epoch in (0, 1) for i in feeder.order(epoch)]
    given = [r["messages"] for r in rows if r["domain"] == domain.name]
    assert given == [peer.trl_row(domain, p)["messages"] for p in asked[:300]]
    spec = mix.settings.trl_spec(tmp_path, rows, 0.5, 1)
    spec["rewards"] = {name: bench.RULE for name in mix.domains.names}
    monkeypatch.syspath_prepend(str(Path(peer.TRL_PEER)))
    parsed = importlib.import_module("grpo_spec").parse_spec(spec)
    assert (parsed.minibatches, parsed.samples_per_update) == (4, 32)
    assert parsed.mask_truncated_completions


def test_trl_gets_the_tool_domain_its_tool_and_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What bench_agentic hands TRL for the tool run config: its rows, its rule, the
    domain's tool, sandbox timeout and turns; the TRL runner's own checks accept it.  Its
    snapshots are judged by ``temper eval`` on the run's own domains config."""
    bench, peer = load_bench("bench_agentic"), load_bench("peer_run")
    mix = peer.read_mix(["--config", str(bench.CONFIG)], tmp_path / "domains")
    domain = mix.domains.train[0][0]
    extras = bench.trl_extras(mix)
    assert extras["rewards"] == {domain.name: "tool_answer"}
    assert (extras["tools"], extras["tool_timeout_s"]) == (["python"], domain.sandbox.timeout_s)
    assert extras["max_tool_calls"] == domain.max_turns - 1
    monkeypatch.setattr(bench, "TRL_ROWS", 50)
    rows = bench.trl_rows(mix)
    assert {r["domain"] for r in rows} == {domain.name} and len(rows) == 50
    spec = {**mix.settings.trl_spec(tmp_path, rows, 0.5, 1), **extras}
    monkeypatch.syspath_prepend(str(Path(peer.TRL_PEER)))
    parsed = importlib.import_module("grpo_spec").parse_spec(spec)
    assert parsed.tools == ["python"] and parsed.max_new_tokens == domain.max_tokens
    command = bench.EvalScorer(mix, tmp_path).command(tmp_path / "t0150.0", tmp_path / "out")
    assert command[command.index("--domains") + 1] == domain.name
    assert command[command.index("--domains-config") + 1] == str(mix.domains.config)
    assert command[command.index("--limit") + 1] == str(mix.plan.eval_problems)


def test_a_reports_greedy_success_is_read_by_domain() -> None:
    report = {"domains": {"modpow": {"unit": {"greedy": {"value": 0.75, "low": 0.6}}}}}
    assert load_bench("bench_agentic").greedy_by_domain(report) == {"modpow": 0.75}
