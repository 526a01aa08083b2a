"""End to end, side by side in one run: Temper's embedded stack vs Hugging Face TRL.

Both train the same warmed-up tiny policy (``temper train --warmup-only``) on the
learning demo's domain (``arithmetic_sum4``: sums of four single-digit numbers) with the
same prompts, reward rule (the first ``<answer>`` tag equals the sum), group size,
samples per step, learning rate and its schedule (linear to a tenth over 600
steps), max new tokens, sampling temperature 1, float32 and no
KL, for the same wall-clock budget.  TRL runs first, alone on the machine (its
``GRPOTrainer`` in its own cached venv, ``deploy/peers/trl``), then Temper's stack
(``temper train``), so neither takes CPU from the other.

Printed for both: trained samples/s end to end (a sample dropped as stale does not
count), optimizer steps, train reward of the first and last steps, and held-out greedy
accuracy against wall clock (189 problems of the eval split, never trained on).  TRL's
held-out curve comes from snapshots it writes off its clock, scored afterwards by the same
greedy decoding; Temper's from the evaluations it runs through its own stack, on its
clock.  The start policy is scored both ways, as a check that the two agree.  Temper's CPU
time per process is printed too: where the two cores went.

Goals (issues 11 and 12): e2e samples/s ratio temper/trl >= 1.5, and Temper reaches TRL's
final held-out accuracy in <= 50% of the time.  Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stack_figures import learner_stages, learner_steps, service_lines  # noqa: E402

from services.domains import load_registry  # noqa: E402
from services.evaluation.heldout import HeldoutSet  # noqa: E402
from services.model.greedy import heldout_greedy_accuracy  # noqa: E402

DOMAIN = "arithmetic_sum4"
GROUP, BATCH, LR = 8, 256, 3e-4
#: ``temper train``'s default schedule, given to TRL too: linear to a tenth over 600 steps.
LR_DECAY_STEPS, LR_FINAL = 600, 0.1
TEMPER = [str(ROOT / ".venv" / "bin" / "temper")]
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, kw_only=True)
class Side:
    name: str
    steps: int
    samples: int
    seconds: float
    rewards: list[float]
    #: (seconds since training started, held-out greedy accuracy)
    curve: list[tuple[float, float]]

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


def prepare(out: Path) -> Path:
    """The shared start policy (built and warmed up once per output directory)."""
    run = out / "temper"
    # Only the model is reused: a learner checkpoint left here would resume the last run.
    for stale in ("learner", "eval", "tensorboard", "nats", "logs"):
        shutil.rmtree(run / stale, ignore_errors=True)
    (run / "train.png").unlink(missing_ok=True)
    subprocess.run([*TEMPER, "train", "--run-dir", str(run), "--warmup-only"], check=True)
    return run / "model"


def run_trl(out: Path, model: Path, minutes: float, threads: int) -> Side:
    python = subprocess.run(
        [str(ROOT / "deploy/peers/trl/build.sh")], check=True, capture_output=True, text=True
    ).stdout.split()[-1]
    work = out / "trl"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec = work / "spec.json"
    spec.write_text(json.dumps(_trl_spec(model, minutes, threads)))
    runner = ROOT / "deploy/peers/trl/grpo_run.py"
    subprocess.run([python, str(runner), str(spec), str(work / "out")], check=True)
    summary = json.loads((work / "out" / "summary.json").read_text())
    steps = [json.loads(line) for line in (work / "out" / "steps.jsonl").read_text().splitlines()]
    heldout = _heldout()
    curve = []
    for snapshot in sorted((work / "out" / "snapshots").iterdir()):
        at = float(snapshot.name[1:])
        curve.append((at, heldout_greedy_accuracy(snapshot, heldout)))
    return Side(
        name="trl",
        steps=int(summary["steps"]),
        samples=int(summary["samples"]),
        seconds=float(summary["train_seconds"]),
        rewards=[float(s["reward_mean"]) for s in steps],
        curve=curve,
    )


def _trl_spec(model: Path, minutes: float, threads: int) -> dict[str, Any]:
    domain = load_registry(None).get(DOMAIN)
    # One row per spelling, as Temper's feeder draws them: the key would fold `4+9+3` and
    # `3+9+4` into one problem and leave TRL fewer prompts than Temper trains on.
    problems = {p.question: p for p in domain.problems(20_000, split="train", seed=0)}.values()
    train = [
        {
            "messages": [
                {"role": m.role, "content": m.content} for m in domain.prompt.messages(p.question)
            ],
            "answer": str(p.metadata["answer"]),
        }
        for p in problems
    ]
    return {
        "model_dir": str(model),
        "train": train,
        "group": GROUP,
        "samples_per_step": BATCH,
        "lr": LR,
        "lr_decay_steps": LR_DECAY_STEPS,
        "lr_final": LR_FINAL,
        "max_new_tokens": domain.max_tokens,
        "temperature": 1.0,
        "minutes": minutes,
        "snapshot_every_s": 60.0,
        "threads": threads,
    }


def run_temper(out: Path, minutes: float) -> tuple[Side, dict[str, float], dict[str, float]]:
    run = out / "temper"
    command = [
        *TEMPER,
        "train",
        "--run-dir",
        str(run),
        "--minutes",
        str(minutes),
        "--lr",
        str(LR),
        "--lr-decay-steps",
        str(LR_DECAY_STEPS),
    ]
    cpu: dict[int, tuple[str, float]] = {}
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            found = re.search(r"\] (\S+) +started \(pid (\d+)", line)
            if found:
                cpu[int(found.group(2))] = (found.group(1), 0.0)
            _sample_cpu(cpu)
    steps = learner_steps(run)
    heldout = [json.loads(x) for x in (run / "eval" / "heldout.jsonl").read_text().splitlines()]
    seconds = minutes * 60
    side = Side(
        name="temper",
        steps=len(steps),
        samples=sum(int(s["samples"]) for s in steps),
        seconds=seconds,
        rewards=[float(s["reward_mean"]) for s in steps],
        curve=[(float(h["elapsed_s"]), float(h["greedy_accuracy"])) for h in heldout],
    )
    usage = {f"{name} (pid {pid})": used for pid, (name, used) in cpu.items()}
    return side, usage, learner_stages(steps)


def _sample_cpu(cpu: dict[int, tuple[str, float]]) -> None:
    """CPU seconds (user + system) each service has used so far, read while it runs."""
    for pid, (name, _) in list(cpu.items()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[pid] = (name, (int(fields[11]) + int(fields[12])) / _CLK_TCK)


def _heldout() -> HeldoutSet:
    return HeldoutSet.of(load_registry(None).get(DOMAIN))


def report(
    trl: Side,
    temper: Side,
    cpu: dict[str, float],
    stages: dict[str, float],
    start_offline: float,
    run_dir: Path,
) -> None:
    print("\n== end to end, same start policy, same budget")
    for side in (trl, temper):
        first = statistics.fmean(side.rewards[:10]) if side.rewards else 0.0
        last = statistics.fmean(side.rewards[-10:]) if side.rewards else 0.0
        print(
            f"{side.name:>7}: {side.steps} optimizer steps, {side.samples} samples in "
            f"{side.seconds:.0f} s = {side.rate:.1f} trained samples/s; "
            f"train reward {first:.3f} -> {last:.3f}"
        )
        curve = ", ".join(f"{t:.0f}s {a:.1%}" for t, a in side.curve)
        print(f"{'':>9}held-out greedy accuracy: {curve}")
    stack = temper.curve[0][1] if temper.curve else float("nan")
    print(f"start policy scored offline: {start_offline:.1%} (by Temper's stack: {stack:.1%})")
    total = sum(cpu.values()) or 1.0
    shares = ", ".join(f"{name} {used:.0f} s ({used / total:.0%})" for name, used in cpu.items())
    print(f"Temper CPU by process: {shares}")
    cycle = stages.pop("cycle", 0.0)
    parts = ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in stages.items())
    print(f"Temper learner step: {cycle * 1000:.0f} ms between steps; {parts}")
    for line in service_lines(run_dir, BATCH):
        print(f"Temper {line}")
    time_to_peer(trl.curve, temper.curve, window=1, label="TRL's final held-out accuracy")
    # One evaluation swings 10-20 points between versions a minute apart: the same
    # comparison on running means of three evaluations is less at the mercy of one.
    time_to_peer(trl.curve, temper.curve, window=3, label="TRL's mean of its last 3 evaluations")
    gain = temper.curve[-1][1] - temper.curve[0][1] if temper.curve else 0.0
    peer_gain = trl.curve[-1][1] - trl.curve[0][1] if trl.curve else 0.0
    print(
        f"held-out gain over the start: Temper {100 * gain:+.1f} points, TRL {100 * peer_gain:+.1f}"
    )
    print(f"e2e samples/s ratio temper/trl: {temper.rate / max(trl.rate, 1e-9):.2f}")


def time_to_peer(
    peer: list[tuple[float, float]], ours: list[tuple[float, float]], window: int, label: str
) -> None:
    """When ``ours`` (as running means of ``window`` evaluations) first reaches the peer's
    final level (the mean of its last ``window``), against the peer's own time to it."""
    if len(peer) < window or len(ours) < window:
        print(f"too few evaluations for {label}")
        return
    target = statistics.fmean(a for _, a in peer[-window:])
    smoothed = [
        (ours[i][0], statistics.fmean(a for _, a in ours[i - window + 1 : i + 1]))
        for i in range(window - 1, len(ours))
    ]
    reached = next((t for t, a in smoothed if a >= target), None)
    if reached is None:
        print(f"Temper never reached {label} ({target:.1%})")
        return
    peer_s = peer[-1][0]
    print(
        f"time to {label} ({target:.1%}): Temper {reached:.0f} s, TRL {peer_s:.0f} s "
        f"(ratio {reached / max(peer_s, 1e-9):.2f}, goal <= 0.50)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="training budget of each")
    parser.add_argument("--out", type=Path, default=ROOT / "run" / "bench_e2e")
    parser.add_argument("--trl-threads", type=int, default=2, help="TRL's torch threads")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = prepare(args.out)
    start_offline = heldout_greedy_accuracy(model, _heldout())
    trl = run_trl(args.out, model, args.minutes, args.trl_threads)
    temper, cpu, stages = run_temper(args.out, args.minutes)
    report(trl, temper, cpu, stages, start_offline, args.out / "temper")
    return 0


if __name__ == "__main__":
    sys.exit(main())
