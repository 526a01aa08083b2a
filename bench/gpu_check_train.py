"""The train section of ``gpu_check``: ``temper train`` for a few minutes, what it reports.

The whole embedded stack (nats-server, generator, validator, replay, learner) runs as
``temper train`` runs it, on its own tiny policy (``temper train`` has no model-size
option), with the generator and the learner on the check's device.  Its output is relayed
line by line; then the learner's ``metrics.jsonl`` gives the reward per step and
``eval/heldout.jsonl`` the held-out figures.  At the end of its time box the run gets
SIGINT (it stops cleanly, skipping the final evaluation), then SIGKILL after a grace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: What ``temper train`` needs besides its minutes: stack start-up, the supervised
#: warm-up of its policy, the final held-out evaluation and the stop.
OVERHEAD_S = 90.0
#: How long a stopped run gets to end before it is killed.
STOP_GRACE_S = 60.0
#: Reward-per-step figures printed at most (evenly spaced beyond).
MAX_SHOWN = 40


@dataclass(frozen=True, kw_only=True)
class TrainOutcome:
    returncode: int
    seconds: float
    minutes: float
    #: The run reached its time box and was stopped.
    cut: bool
    #: The learner's metrics.jsonl lines and the held-out results, in order.
    steps: list[dict[str, Any]]
    heldout: list[dict[str, Any]]
    log: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.steps) and bool(self.heldout)

    def lines(self) -> list[str]:
        lines = [f"  reward per step ({len(self.steps)} steps): {self._rewards()}"]
        lines += [f"  {_heldout(h)}" for h in self.heldout]
        if not self.ok:
            return [*lines, f"RESULT train: FAILED ({self._problem()}; stderr in {self.log})"]
        return [*lines, f"RESULT train: {self.summary()}"]

    def summary(self) -> str:
        if not self.ok:
            return f"FAILED ({self._problem()})"
        first, last = _windows([s["reward_mean"] for s in self.steps])
        start, end = self.heldout[0], self.heldout[-1]
        return (
            f"{len(self.steps)} steps in {self.seconds:.0f} s, reward first {first:.3f} -> "
            f"last {last:.3f}, held-out greedy {start['greedy_accuracy']:.1%} "
            f"(v{start['version']}) -> {end['greedy_accuracy']:.1%} (v{end['version']}), "
            f"sampled {start['sampled_accuracy']:.1%} -> {end['sampled_accuracy']:.1%}"
        )

    def _rewards(self) -> str:
        rewards = [float(s["reward_mean"]) for s in self.steps]
        if len(rewards) <= MAX_SHOWN:
            return " ".join(f"{r:.3f}" for r in rewards) or "none"
        every = -(-len(rewards) // MAX_SHOWN)
        shown = " ".join(f"{r:.3f}" for r in rewards[::every])
        return f"every {every}th: {shown}; all in metrics.jsonl"

    def _problem(self) -> str:
        problems = []
        if self.returncode != 0:
            problems.append(f"exit {self.returncode}")
        if not self.steps:
            problems.append("no learner step")
        if not self.heldout:
            problems.append("no held-out result")
        if self.cut:
            problems.append("stopped at its time box")
        return ", ".join(problems)


def _heldout(result: Mapping[str, Any]) -> str:
    return (
        f"held-out v{result['version']} at {result['elapsed_s']:.0f} s: greedy "
        f"{result['greedy_accuracy']:.1%}, sampled {result['sampled_accuracy']:.1%} on "
        f"{result['problems']} problems (chance {result['chance']:.1%})"
    )


def _windows(values: Sequence[float]) -> tuple[float, float]:
    """Mean of the first and of the last few values (as ``temper train``'s summary)."""
    window = max(1, min(10, len(values) // 3))
    return statistics.fmean(values[:window]), statistics.fmean(values[-window:])


def fit_minutes(minutes: float, box_s: float) -> float:
    """``minutes``, shortened so that the run and its overhead fit in ``box_s``."""
    room = (box_s - OVERHEAD_S) / 60
    return round(max(0.25, min(minutes, room)), 2)


def train_section(
    *,
    out: Path,
    minutes: float,
    box_s: float,
    device: str,
    args: Sequence[str],
    env: Mapping[str, str],
    start_model: Path | None = None,
) -> TrainOutcome:
    """Run ``temper train`` in ``out`` for ``minutes`` (within ``box_s``) and read what it
    wrote; from ``start_model`` when given (else it builds and warms up its own policy)."""
    run_minutes = fit_minutes(minutes, box_s)
    shutil.rmtree(out, ignore_errors=True)
    if start_model is not None:
        # A run directory that holds a policy already trains it as it is.
        shutil.copytree(start_model, out / "model")
    command = [
        *(sys.executable, "-m", "services", "train"),
        *("--run-dir", str(out), "--nats-port", str(free_port())),
        *("--minutes", f"{run_minutes:g}", *args),
    ]
    environment = {
        **os.environ,
        "TEMPER_GENERATOR_DEVICE": device,
        "TEMPER_LEARNER_DEVICE": device,
        **env,
    }
    shortened = f" (shortened from {minutes:g} to fit)" if run_minutes < minutes else ""
    policy = "the check's model" if start_model else "its own tiny policy, warmed up"
    print(
        f"  temper train --minutes {run_minutes:g}{shortened} {' '.join(args)}\n"
        f"  start policy: {policy}; generator and learner on {device}; time box {box_s:.0f} s",
        flush=True,
    )
    log = out.with_name(f"{out.name}-stderr.log")
    started = time.monotonic()
    returncode, cut = run_relayed(command, environment, box_s, log)
    return TrainOutcome(
        returncode=returncode,
        seconds=time.monotonic() - started,
        minutes=run_minutes,
        cut=cut,
        steps=_jsonl(out / "learner" / "metrics.jsonl"),
        heldout=_jsonl(out / "eval" / "heldout.jsonl"),
        log=log,
    )


def run_relayed(
    command: Sequence[str], env: Mapping[str, str], box_s: float, log: Path
) -> tuple[int, bool]:
    """Run ``command``, its stdout relayed as it comes, stderr to ``log``; stop it (SIGINT,
    then SIGKILL) at ``box_s``.  Returns the exit status and whether it was stopped."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as errors:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, env=dict(env), cwd=ROOT
        )
        relay = threading.Thread(target=_relay, args=(proc,), daemon=True)
        relay.start()
        cut = False
        try:
            proc.wait(timeout=max(box_s, 1.0))
        except subprocess.TimeoutExpired:
            cut = True
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        relay.join(timeout=10)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print("\n".join(f"  ! {line}" for line in tail), flush=True)
    return proc.returncode, cut


def _relay(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"  | {line.rstrip()}", flush=True)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
