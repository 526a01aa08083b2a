"""Agentic, side by side in one run: Temper vs Hugging Face TRL on the tool domain.

Both train the same warmed-up tiny policy (``temper train --config RUN.toml
--warmup-only``, default deploy/runs/tools.toml: ``modpow``, answers out of reach by
guessing and one ``python`` call away) for the same wall-clock budget, TRL first and
alone on the machine, then Temper's stack.  The shared parts are in ``peer_run.py``.

TRL's ``GRPOTrainer`` gets ``tools=[python]``: its own tool loop, the code run in a
subprocess with the domain's sandbox timeout, at most ``max_turns - 1`` tool rounds a
completion.  It gets the problems Temper's feeder asks, the same prompts, group size,
samples per batch, optimizer steps per batch, learning rate, temperature 1, float32, no
KL, and the domain's reward (0.8 for the last ``<answer>`` tag equal to the answer, as
Temper's ``exact`` validator compares it, 0.2 for well-formed tool calls).  The calls and
outputs are written as Temper's agent loop writes them (``deploy/peers/trl/grpo_spec.py``:
the chat template; ``grpo_run.py``: a turn stops at ``</tool_call>`` and is closed with
the end-of-turn token before the output).  Where the two cannot be the same:

- Temper runs the code in its Docker sandbox (``--network none``, memory limit); TRL in a
  plain subprocess of its own interpreter.
- ``max_tokens`` caps each of Temper's turns; TRL's ``max_completion_length`` caps the
  whole completion, tool outputs included.
- A call that does not parse gets a tool error in Temper's next turn; TRL ends the
  completion there (its parser falls back to text).

Held-out success is judged the same way on both sides: greedy, by ``temper eval`` (the
agent loop, the sandbox and the domain's validators of Temper's own evaluation) for TRL's
snapshots, by the evaluations Temper's stack runs during its run for Temper.  Printed:
TRL's settings, both sides' trained samples/s and train reward, both held-out curves,
where each side's time went (TRL: generation with its tool rounds, the tools alone, the
rest training; Temper: CPU by process, its learner's step, the generator's tool time and
infra failures) and the two goals of issue 29 (samples/s >= 1.5x TRL's; TRL's final
held-out success in <= 50% of its time).  Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import children  # noqa: E402
import peer_report  # noqa: E402
import peer_run  # noqa: E402

CONFIG = ROOT / "deploy" / "runs" / "tools.toml"
#: TRL's reward rule for the tool domains (deploy/peers/trl/grpo_spec.py).
RULE = "tool_answer"
#: Rows of TRL's dataset: far more than it trains on in a run.
TRL_ROWS = 5_000
#: Seconds of TRL's training clock between snapshots: each costs an evaluation stack.
SNAPSHOT_EVERY_S = 150.0


class EvalScorer:
    """Greedy held-out success of a model directory by ``temper eval``: the same agent
    loop, sandbox and validators as Temper's evaluation during its run."""

    def __init__(self, mix: peer_run.Mix, folder: Path) -> None:
        self.names = ",".join(domain.name for domain in mix.domains.eval)
        self.config = mix.domains.config
        self.limit = mix.plan.eval_problems
        self.folder = folder

    def command(self, model_dir: Path, out: Path) -> list[str]:
        command = [*peer_run.TEMPER, "eval", "--policy", str(model_dir), "--domains", self.names]
        if self.config is not None:
            command += ["--domains-config", str(self.config)]
        return [*command, "--samples", "0", "--limit", str(self.limit), "--out", str(out)]

    def accuracy(self, model_dir: Path) -> dict[str, float]:
        out = self.folder / model_dir.name
        children.run(self.command(model_dir, out), stdout=subprocess.DEVNULL)
        return greedy_by_domain(json.loads((out / "report.json").read_text()))


def greedy_by_domain(report: dict[str, Any]) -> dict[str, float]:
    """Each domain's greedy success in a ``temper eval`` report."""
    return {
        name: float(figures["unit"]["greedy"]["value"])
        for name, figures in report["domains"].items()
    }


def trl_extras(mix: peer_run.Mix) -> dict[str, Any]:
    """What TRL's spec needs for the tool domain: its rule, its tool and its limits."""
    (domain, _), *others = mix.domains.train
    if others or not domain.tools:
        raise SystemExit(f"{CONFIG.name}: the agentic bench takes one tool domain")
    return {
        "rewards": {domain.name: RULE},
        "tools": list(domain.tools),
        "tool_timeout_s": domain.sandbox.timeout_s,
        "max_tool_calls": max(1, domain.max_turns - 1),
        "snapshot_every_s": SNAPSHOT_EVERY_S,
    }


def trl_rows(mix: peer_run.Mix) -> list[dict[str, Any]]:
    domain = mix.domains.train[0][0]
    rows = peer_run.feeder_rows(domain, mix.plan.seed, TRL_ROWS)
    return [{**row, "domain": domain.name} for row in rows]


def report(mix: peer_run.Mix, result: peer_run.Comparison) -> None:
    print(f"\n== tool domain {mix.domains.names[0]}: same start policy, same budget")
    peer_report.print_runs(result, mix.settings, "held-out greedy success")
    print_trl_time(result.run_dir.parent / "trl" / "out" / "summary.json")
    peer_report.print_stack(result, mix.settings.batch)
    peer_report.print_goals(result, "held-out success")


def print_trl_time(path: Path) -> None:
    """TRL's training clock split: generation with its tool rounds, tools alone, the rest."""
    summary = json.loads(path.read_text())
    seconds = summary.get("seconds", {})
    total = float(summary["train_seconds"]) or 1.0
    generate, tools = seconds.get("generate", 0.0), seconds.get("tools", 0.0)
    print(
        f"TRL time: generation {generate - tools:.0f} s ({(generate - tools) / total:.0%}), "
        f"tool execution {tools:.0f} s ({tools / total:.0%}), training and the rest "
        f"{total - generate:.0f} s ({(total - generate) / total:.0%}) of {total:.0f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG, help="run config (one tool domain)")
    parser.add_argument("--minutes", type=float, default=15.0, help="training budget of each")
    parser.add_argument("--out", type=Path, default=ROOT / "run" / "bench_agentic")
    parser.add_argument("--trl-threads", type=int, default=2, help="TRL's torch threads")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    mix = peer_run.read_mix(("--config", str(args.config)), args.out / "domains")
    scorer = EvalScorer(mix, args.out / "trl" / "eval")
    extras = trl_extras(mix)
    result = peer_run.compare(
        args.out, mix, trl_rows(mix), args.minutes, args.trl_threads, scorer, **extras
    )
    report(mix, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
