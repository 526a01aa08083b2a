"""End to end, side by side in one run: Temper's embedded stack vs Hugging Face TRL.

Both train the same warmed-up tiny policy (``temper train --warmup-only``) on the learning
demo's domain (``arithmetic_sum4``: sums of four single-digit numbers) with the same
problems (TRL's rows are the problems Temper's feeder asks, epoch after epoch, each in the
spelling its epoch asks it in), prompts, reward rule (the first ``<answer>`` tag equals the
sum), group size, samples per batch, optimizer steps per batch (Temper's ``minibatches``:
TRL splits each generation batch into as many steps), learning rate and its schedule (linear
to a tenth over 600 batches), max new tokens, completions cut at that limit left out of the
loss (TRL's ``mask_truncated_completions``; the domain's ``overlong = "filter"`` in Temper),
sampling temperature 1, float32 and no KL, for the same wall-clock budget. TRL runs first,
alone on the machine (its ``GRPOTrainer`` in its own cached venv, ``deploy/peers/trl``),
then Temper's stack (``temper train``), so neither takes CPU from the other. Both sides'
settings come from the flags given to ``temper train``, read by Temper's own run-config
code; the shared parts are in ``peer_run.py``.

Printed for both: trained samples/s end to end (a sample dropped as stale does not
count), optimizer steps, train reward of the first and last batches, and held-out greedy
accuracy against wall clock (the eval split's problems, never trained on).  TRL's
held-out curve comes from snapshots it writes off its clock, decoded greedily afterwards
and judged by the domain's validator; Temper's from the evaluations it runs through its
own stack, on its clock.  The start policy is scored both ways, as a check that the two
agree.  Temper's CPU time per process is printed too: where the two cores went.

Goals (issues 11 and 12): e2e samples/s ratio temper/trl >= 1.5, and Temper reaches TRL's
final held-out accuracy in <= 50% of the time.  Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import peer_report  # noqa: E402
import peer_run  # noqa: E402

DOMAIN = "arithmetic_sum4"
#: ``temper train``'s learner settings, named so that a change of its defaults changes both
#: sides: lr falls linearly to a tenth over 600 batches.
FLAGS = (
    *("--domain", DOMAIN, "--group", "8", "--batch", "256", "--minibatches", "2"),
    *("--lr", "3e-4", "--lr-decay-steps", "600"),
)


#: Rows of TRL's dataset: far more than it trains on in a run, so it never sees an epoch.
TRL_ROWS = 20_000


def report(mix: peer_run.Mix, result: peer_run.Comparison) -> None:
    print("\n== end to end, same start policy, same budget")
    peer_report.print_runs(result, mix.settings, "held-out greedy accuracy")
    print(f"max new tokens {mix.settings.max_new_tokens}")
    stack = result.temper.curve[0][1] if result.temper.curve else float("nan")
    offline = result.trl.curve[0][1] if result.trl.curve else float("nan")
    print(
        f"start policy scored offline (TRL's snapshot at 0 s): {offline:.1%} "
        f"(by Temper's stack: {stack:.1%})"
    )
    peer_report.print_stack(result, mix.settings.batch)
    peer_report.print_goals(result, "held-out accuracy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="training budget of each")
    parser.add_argument("--out", type=Path, default=ROOT / "run" / "bench_e2e")
    parser.add_argument("--trl-threads", type=int, default=2, help="TRL's torch threads")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    mix = peer_run.read_mix(FLAGS, args.out / "domains")
    rows = peer_run.feeder_rows(mix.domains.train[0][0], mix.plan.seed, TRL_ROWS)
    report(mix, peer_run.compare(args.out, mix, rows, args.minutes, args.trl_threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
