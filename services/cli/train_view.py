"""What ``temper train`` shows: a progress bar, held-out results, a summary and a PNG plot."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

_LINE_EVERY_S = 15.0


def say(line: str) -> None:
    # tqdm.write keeps a running progress bar intact below the line.
    tqdm.write(f"[temper {time.strftime('%H:%M:%S')}] {line}", file=sys.stdout)


class Progress:
    """A wall-clock bar with the learner's step, trained samples/s, reward and held-out
    accuracy; where stdout is not a terminal, the same figures as a line every 15 s."""

    def __init__(self, seconds: float) -> None:
        self._bar: tqdm[Any] | None = None
        if sys.stdout.isatty():
            self._bar = tqdm(
                total=round(seconds),
                unit="s",
                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s {postfix}",
                mininterval=1.0,
                file=sys.stdout,
                dynamic_ncols=True,
            )
        self._seconds = seconds
        self._started = time.monotonic()
        self._printed = self._started
        self._closed = False

    def update(self, steps: list[dict[str, Any]], heldout: list[dict[str, Any]]) -> None:
        if self._closed:
            return
        elapsed = time.monotonic() - self._started
        figures = _figures(steps, heldout, elapsed)
        if self._bar is not None:
            self._bar.n = min(round(elapsed), self._bar.total)
            self._bar.set_postfix(figures, refresh=False)
            self._bar.refresh()
        elif time.monotonic() - self._printed >= _LINE_EVERY_S:
            self._printed = time.monotonic()
            text = ", ".join(f"{k} {v}" for k, v in figures.items())
            say(f"{elapsed:.0f}/{self._seconds:.0f} s: {text}")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._bar is not None:
                self._bar.close()


def _figures(
    steps: list[dict[str, Any]], heldout: list[dict[str, Any]], elapsed: float
) -> dict[str, str]:
    figures = {"step": str(steps[-1]["step"] if steps else 0)}
    if steps:
        figures["samples/s"] = f"{sum(s['samples'] for s in steps) / max(elapsed, 1e-9):.0f}"
        figures["reward"] = f"{statistics.fmean(s['reward_mean'] for s in steps[-10:]):.3f}"
    if heldout:
        figures["held-out"] = f"{heldout[-1]['greedy_accuracy']:.1%}"
    return figures


def heldout_line(result: dict[str, Any]) -> str:
    samples = result["samples"]
    return (
        f"held-out v{result['version']} at {result['elapsed_s']:.0f} s: greedy "
        f"{result['greedy_accuracy']:.1%}, sampled {result['sampled_accuracy']:.1%}, "
        f"pass@{samples} {result[f'pass_at_{samples}']:.1%} on {result['problems']} problems "
        f"(chance {result['chance']:.1%})"
    )


def summary(steps: list[dict[str, Any]], heldout: list[dict[str, Any]]) -> list[str]:
    lines = []
    if len(steps) >= 4:
        window = max(2, min(10, len(steps) // 3))
        first = statistics.fmean(s["reward_mean"] for s in steps[:window])
        last = statistics.fmean(s["reward_mean"] for s in steps[-window:])
        lines.append(
            f"{len(steps)} learner steps: train reward of the first {window} {first:.3f}, "
            f"of the last {window} {last:.3f} ({last - first:+.3f})"
        )
    else:
        lines.append(f"{len(steps)} learner steps: too few to compare (run longer with --minutes)")
    if len(heldout) >= 2:
        start, end = heldout[0], heldout[-1]
        gain = end["greedy_accuracy"] - start["greedy_accuracy"]
        lines.append(
            f"held-out greedy accuracy {start['greedy_accuracy']:.1%} (v{start['version']}) -> "
            f"{end['greedy_accuracy']:.1%} (v{end['version']}): {100 * gain:+.1f} points on "
            f"{end['problems']} problems never trained on; sampled {start['sampled_accuracy']:.1%}"
            f" -> {end['sampled_accuracy']:.1%}; chance {end['chance']:.1%}"
        )
    return lines


def plot(path: Path, steps: list[dict[str, Any]], heldout: list[dict[str, Any]], t0: float) -> None:
    """Reward per step and held-out accuracy against wall clock, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    top.plot([s["at"] - t0 for s in steps], [s["reward_mean"] for s in steps], lw=1)
    top.set_ylabel("train reward (batch mean)")
    top.grid(alpha=0.3)
    times = [h["elapsed_s"] for h in heldout]
    bottom.plot(times, [h["greedy_accuracy"] for h in heldout], "o-", label="greedy")
    bottom.plot(times, [h["sampled_accuracy"] for h in heldout], "s--", label="sampled")
    if heldout:
        bottom.axhline(heldout[0]["chance"], color="grey", ls=":", label="chance")
    bottom.set_ylabel("held-out accuracy")
    bottom.set_xlabel("wall clock since training started (s)")
    bottom.set_ylim(0, 1)
    bottom.grid(alpha=0.3)
    bottom.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
