"""A run config's mix of domains, side by side in one run: Temper vs Hugging Face TRL.

Both train the same warmed-up tiny policy (``temper train --config RUN.toml
--warmup-only``) on every domain of the mix (default deploy/runs/mix.toml) for the same
wall-clock budget, TRL first and alone on the machine, then Temper's stack (``temper
train --config RUN.toml``, with the config's own eval settings).  The shared parts are in
``peer_run.py``; the mix, its weights and the learner settings are read from the config
by Temper's own run-config code, so whatever the config lists is what both train on.

TRL's ``GRPOTrainer`` gets the training problems of every domain in one dataset with a
``domain`` column: the problems Temper's feeder asks of each domain, epoch after epoch, in
the spellings it asks them in, rows in proportion to the domain's weight (TRL draws
uniformly from its dataset, Temper's feeder by weight), and the same prompts, group size,
samples per batch, optimizer steps per batch (Temper's ``minibatches``), learning rate and
schedule, temperature 1, float32 and no KL. Where the two cannot be the same:

- Completion cap: TRL has one ``max_completion_length``, the largest ``max_tokens`` of the
  mix; Temper caps each domain at its own (printed).
- Overlong samples: TRL leaves every completion cut at its cap out of the loss
  (``mask_truncated_completions``); Temper does so for the domains with ``overlong =
  "filter"`` and trains on the others' (printed).
- Reward: TRL routes each sample by its ``domain`` to one rule for every domain of this
  mix: the number in the last complete ``<answer>`` tag equals the answer (``12.0`` is
  ``12``), as Temper's validators read it. Where Temper's differ: ``math`` compares
  numbers within a relative 1e-6 and reads fractions and percentages; ``reasoning_gym``
  runs the dataset's own scorer, which gives partial credit when the answer merely
  contains the right one (``len(answer) / len(given)``: ``-12`` earns 2/3 for ``12``),
  compares ``chain_sum`` answers as decimals with commas dropped and ``basic_arithmetic``
  answers as exact strings. Held-out accuracy is judged by Temper's validators on both
  sides (a greedy answer passes at reward 1).

Printed: TRL's settings (its spec less the dataset rows), trained samples/s of each and
their ratio, train reward, held-out greedy accuracy macro-averaged over the mix's eval
domains against time (TRL: its snapshots, decoded greedily afterwards on the same held-out
problems, as many per domain as the config's ``[eval] problems``; Temper: the
evaluations its stack runs, ``eval/heldout.jsonl`` and its macro ``heldout_macro.jsonl``),
each domain's accuracy at the start and the end for both, and where Temper's CPU went.

Goals: "Temper's trained samples/s >= 1.5x TRL's" and "Temper reaches TRL's final macro
held-out accuracy in <= 50% of TRL's time".  Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import peer_report  # noqa: E402
import peer_run  # noqa: E402

from services.cli.runconfig import RunDomains  # noqa: E402

#: Rows of TRL's dataset over all domains (what the feeder asks of each): far more than
#: TRL trains on in a run, so it never sees an epoch.
TRL_ROWS = 20_000
#: TRL's reward rule for every domain of the mix (deploy/peers/trl/grpo_spec.py).
RULE = "last_answer_number"


def rows_per_domain(weights: Sequence[float], total: int) -> list[int]:
    """``total`` rows shared in proportion to ``weights`` (at least one each)."""
    whole = sum(weights)
    return [max(1, round(total * weight / whole)) for weight in weights]


def trl_rows(domains: RunDomains, seed: int) -> list[dict[str, Any]]:
    counts = rows_per_domain([weight for _, weight in domains.train], TRL_ROWS)
    return [
        {**row, "domain": domain.name}
        for (domain, _), count in zip(domains.train, counts, strict=True)
        for row in peer_run.feeder_rows(domain, seed, count)
    ]


def report(mix: peer_run.Mix, result: peer_run.Comparison) -> None:
    domains = mix.domains
    names = ", ".join(f"{domain.name} x{weight:g}" for domain, weight in domains.train)
    print(f"\n== mix of {len(domains.train)} domains ({names}): same start policy, same budget")
    accuracy = f"held-out greedy accuracy, macro over {len(domains.eval)} domains"
    peer_report.print_runs(result, mix.settings, accuracy)
    _print_differences(mix.settings, domains)
    _print_domains([domain.name for domain in domains.eval], result.trl, result.temper)
    peer_report.print_stack(result, mix.settings.batch)
    peer_report.print_goals(result, "macro held-out accuracy")


def _print_differences(settings: peer_run.Matched, domains: RunDomains) -> None:
    train = [domain for domain, _ in domains.train]
    caps = ", ".join(f"{d.name} {d.max_tokens}" for d in train)
    print(f"max new tokens: TRL {settings.max_new_tokens} (the mix's largest); Temper {caps}")
    filtered = [d.name for d in train if d.overlong == "filter"]
    kept = [d.name for d in train if d.overlong != "filter"]
    print(
        "overlong: TRL leaves out every truncated completion; Temper leaves out those of "
        f"{', '.join(filtered) or 'no domain'} and trains on those of {', '.join(kept) or 'none'}"
    )
    judges = ", ".join(f"{d.name} {'+'.join(v.kind for v in d.validators)}" for d in train)
    print(
        f"reward: TRL {RULE} (the last <answer> tag, as a number) for every domain; "
        f"Temper's validators: {judges}"
    )


def _print_domains(names: list[str], trl: peer_run.Side, temper: peer_run.Side) -> None:
    """Each domain's held-out greedy accuracy at the first and last evaluation of each."""
    print(f"{'held-out greedy by domain':<28}{'TRL start -> end':>20}{'Temper start -> end':>22}")
    for name in names:
        print(f"{name:<28}{_ends(trl, name):>20}{_ends(temper, name):>22}")


def _ends(side: peer_run.Side, name: str) -> str:
    if not side.heldout or name not in side.heldout[0][1]:
        return "-"
    return f"{side.heldout[0][1][name]:.1%} -> {side.heldout[-1][1].get(name, float('nan')):.1%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="training budget of each")
    parser.add_argument("--out", type=Path, default=ROOT / "run" / "bench_mix")
    parser.add_argument("--config", type=Path, default=ROOT / "deploy" / "runs" / "mix.toml")
    parser.add_argument("--trl-threads", type=int, default=2, help="TRL's torch threads")
    parser.add_argument(
        "--nats-port", type=int, help="Temper's nats-server port (default: the config's)"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    flags = ["--config", str(args.config)]
    if args.nats_port is not None:
        flags += ["--nats-port", str(args.nats_port)]
    mix = peer_run.read_mix(flags, args.out / "domains")
    rewards = {domain.name: RULE for domain, _ in mix.domains.train}
    rows = trl_rows(mix.domains, mix.plan.seed)
    result = peer_run.compare(args.out, mix, rows, args.minutes, args.trl_threads, rewards=rewards)
    report(mix, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
