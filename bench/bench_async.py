"""Synchronous vs asynchronous: the same embedded stack, the same start policy and steps.

``temper train --max-staleness 0`` is the synchronous loop: the generator admits one
batch, waits until the learner has trained on it and its new version is loaded, then
starts the next (on-policy, as a synchronous trainer runs).  The default bound (2) lets
generation run ahead while the learner trains.  Both run the same number of learner
steps; the wall time of a window of steps (after the first few, which start from a
buffer filled during the start-up evaluation) is compared.

The pipelining limit comes from the synchronous run's own stage times: there the
learner's busy time per step (train, export, publish) and the rest of the cycle (the
generation side: generating the batch, scoring it, serving it, loading the new weights)
follow each other, so an ideal overlap takes ``max(learner, generation)`` per step.
Goal (issue 11): asynchronous >= 90% of that limit.  Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stack_figures import learner_steps, service_lines  # noqa: E402

TEMPER = [str(ROOT / ".venv" / "bin" / "temper")]
BATCH = 256
#: Learner stages that are the learner working, not waiting for a batch.
BUSY = ("train", "export", "publish", "checkpoint", "commit")


@dataclass(frozen=True, kw_only=True)
class Window:
    steps: int
    seconds: float
    busy: float

    @property
    def cycle(self) -> float:
        return self.seconds / self.steps

    @property
    def waiting(self) -> float:
        return self.cycle - self.busy


def window(steps: list[dict[str, Any]], skip: int, count: int) -> Window:
    """Steps ``skip+1 .. skip+count``: wall time between their ends, learner busy time."""
    if len(steps) < skip + count + 1:
        raise SystemExit(
            f"only {len(steps)} learner steps were recorded, {skip + count + 1} needed"
        )
    chosen = steps[skip + 1 : skip + count + 1]
    seconds = chosen[-1]["at"] - steps[skip]["at"]
    busy = sum(sum(s.get(f"time_{name}", 0.0) for name in BUSY) for s in chosen) / count
    return Window(steps=count, seconds=seconds, busy=busy)


def run(out: Path, name: str, model: Path, staleness: int, steps: int) -> Path:
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(model, run_dir / "model")
    command = [
        *TEMPER,
        "train",
        "--run-dir",
        str(run_dir),
        "--max-staleness",
        str(staleness),
        "--max-steps",
        str(steps),
        "--minutes",
        "60",
        "--eval-every",
        "0",
        "--batch",
        str(BATCH),
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return run_dir


def describe(name: str, part: Window) -> str:
    return (
        f"{name:>5}: {part.steps} steps in {part.seconds:.1f} s = {part.cycle * 1000:.0f} ms per "
        f"step (learner busy {part.busy * 1000:.0f} ms, waiting for its batch "
        f"{part.waiting * 1000:.0f} ms)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="learner steps timed in each run")
    parser.add_argument("--skip", type=int, default=4, help="first steps left out of the window")
    parser.add_argument("--out", type=Path, default=ROOT / "run" / "bench_async")
    args = parser.parse_args()
    start = args.out / "start"
    subprocess.run([*TEMPER, "train", "--run-dir", str(start), "--warmup-only"], check=True)
    total = args.skip + args.steps + 1
    runs = {
        name: run(args.out, name, start / "model", staleness, total)
        for name, staleness in (("sync", 0), ("async", 2))
    }
    sync, fast = (window(learner_steps(runs[n]), args.skip, args.steps) for n in ("sync", "async"))
    print("\n== synchronous vs asynchronous, same stack, same start, same steps")
    for name, part in (("sync", sync), ("async", fast)):
        print(describe(name, part))
        for line in service_lines(runs[name], BATCH):
            print(f"{'':>7}{line}")
    generation = sync.waiting
    limit = max(sync.busy, generation)
    print(
        f"pipelining limit from the synchronous stage times: max(learner {sync.busy * 1000:.0f} "
        f"ms, generation side {generation * 1000:.0f} ms) = {limit * 1000:.0f} ms per step"
    )
    print(f"async speed-up over sync: {sync.seconds / fast.seconds:.2f}x")
    print(f"async at {limit / fast.cycle:.0%} of the pipelining limit (goal >= 90%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
