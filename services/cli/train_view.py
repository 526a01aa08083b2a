"""What ``temper train`` shows: a progress bar, held-out results, a summary and a PNG plot."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from services.evaluation.heldout import MACRO
from services.evaluation.runner import RoundResult

_LINE_EVERY_S = 15.0


def say(line: str) -> None:
    # tqdm.write keeps a running progress bar intact below the line.
    tqdm.write(f"[temper {time.strftime('%H:%M:%S')}] {line}", file=sys.stdout)


class Progress:
    """A wall-clock bar with the learner's step, trained samples/s, reward and held-out
    accuracy; where stdout is not a terminal, the same figures as a line every 15 s.
    ``seconds`` None: no time budget (the run ends at a step count), the bar counts up."""

    def __init__(self, seconds: float | None) -> None:
        self._bar: tqdm[Any] | None = None
        if sys.stdout.isatty():
            self._bar = tqdm(
                total=None if seconds is None else round(seconds),
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

    def update(self, steps: list[dict[str, Any]], heldout: Sequence[RoundResult]) -> None:
        if self._closed:
            return
        elapsed = time.monotonic() - self._started
        figures = _figures(steps, heldout, elapsed)
        if self._bar is not None:
            total = self._bar.total
            self._bar.n = round(elapsed) if total is None else min(round(elapsed), total)
            self._bar.set_postfix(figures, refresh=False)
            self._bar.refresh()
        elif time.monotonic() - self._printed >= _LINE_EVERY_S:
            self._printed = time.monotonic()
            text = ", ".join(f"{k} {v}" for k, v in figures.items())
            budget = "" if self._seconds is None else f"/{self._seconds:.0f}"
            say(f"{elapsed:.0f}{budget} s: {text}")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._bar is not None:
                self._bar.close()


def _figures(
    steps: list[dict[str, Any]], heldout: Sequence[RoundResult], elapsed: float
) -> dict[str, str]:
    figures = {"step": str(steps[-1]["step"] if steps else 0)}
    if steps:
        figures["samples/s"] = f"{sum(s['samples'] for s in steps) / max(elapsed, 1e-9):.0f}"
        figures["reward"] = f"{statistics.fmean(s['reward_mean'] for s in steps[-10:]):.3f}"
    if heldout:
        figures["held-out"] = f"{heldout[-1].headline['greedy_accuracy']:.1%}"
    return figures


def heldout_lines(result: RoundResult) -> list[str]:
    """The evaluation's headline; with several domains, then one line per domain."""
    lines = [heldout_line(result.headline)]
    if len(result.domains) > 1:
        lines += [f"  {line['domain']}: {_figures_of(line)}" for line in result.domains]
    return lines


def heldout_line(result: dict[str, Any]) -> str:
    what = "held-out" if result["domain"] != MACRO else "held-out (macro average)"
    return f"{what} v{result['version']} at {result['elapsed_s']:.0f} s: {_figures_of(result)}"


def _figures_of(line: dict[str, Any]) -> str:
    samples = line["samples"]
    sampled = (
        f", sampled {line['sampled_accuracy']:.1%}, pass@{samples} {line[f'pass_at_{samples}']:.1%}"
        if samples
        else ""
    )
    return (
        f"greedy {line['greedy_accuracy']:.1%}{sampled} on {line['problems']} problems "
        f"(chance {line['chance']:.1%})"
    )


def summary(steps: list[dict[str, Any]], heldout: Sequence[RoundResult]) -> list[str]:
    lines = [_reward_summary(steps)]
    if len(heldout) >= 2:
        start, end = heldout[0], heldout[-1]
        what = "macro-averaged held-out" if len(end.domains) > 1 else "held-out"
        lines.append(f"{what} {_change(start.headline, end.headline)}")
        if len(end.domains) > 1:
            before = {line["domain"]: line for line in start.domains}
            lines += [
                f"  {line['domain']}: {_change(before[line['domain']], line)}"
                for line in end.domains
                if line["domain"] in before
            ]
    return lines


def _reward_summary(steps: list[dict[str, Any]]) -> str:
    if len(steps) < 4:
        return f"{len(steps)} learner steps: too few to compare (run longer with --minutes)"
    window = max(2, min(10, len(steps) // 3))
    first = statistics.fmean(s["reward_mean"] for s in steps[:window])
    last = statistics.fmean(s["reward_mean"] for s in steps[-window:])
    return (
        f"{len(steps)} learner steps: train reward of the first {window} {first:.3f}, "
        f"of the last {window} {last:.3f} ({last - first:+.3f})"
    )


def _change(start: dict[str, Any], end: dict[str, Any]) -> str:
    gain = end["greedy_accuracy"] - start["greedy_accuracy"]
    return (
        f"greedy accuracy {start['greedy_accuracy']:.1%} (v{start['version']}) -> "
        f"{end['greedy_accuracy']:.1%} (v{end['version']}): {100 * gain:+.1f} points on "
        f"{end['problems']} problems never trained on; sampled {start['sampled_accuracy']:.1%}"
        f" -> {end['sampled_accuracy']:.1%}{_pass_change(start, end)}; chance {end['chance']:.1%}"
    )


def _pass_change(start: dict[str, Any], end: dict[str, Any]) -> str:
    key = f"pass_at_{end.get('samples', 0)}"
    if not end.get("samples") or key not in start or key not in end:
        return ""
    return f"; pass@{end['samples']} {start[key]:.1%} -> {end[key]:.1%}"


def plot(
    path: Path, steps: list[dict[str, Any]], heldout: Sequence[RoundResult], t0: float
) -> None:
    """Reward per step and held-out accuracy (each domain's greedy too) against wall clock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    top.plot([s["at"] - t0 for s in steps], [s["reward_mean"] for s in steps], lw=1)
    top.set_ylabel("train reward (batch mean)")
    top.grid(alpha=0.3)
    _heldout_panel(bottom, heldout)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _heldout_panel(axes: Any, heldout: Sequence[RoundResult]) -> None:
    times = [r.headline["elapsed_s"] for r in heldout]
    several = bool(heldout) and len(heldout[-1].domains) > 1
    label = "greedy (macro average)" if several else "greedy"
    axes.plot(times, [r.headline["greedy_accuracy"] for r in heldout], "o-", lw=2, label=label)
    axes.plot(times, [r.headline["sampled_accuracy"] for r in heldout], "s--", label="sampled")
    if several:
        for name in [line["domain"] for line in heldout[-1].domains]:
            points = [(r.headline["elapsed_s"], _greedy_of(r, name)) for r in heldout]
            shown = [(t, v) for t, v in points if v is not None]
            axes.plot(*zip(*shown, strict=True), ".:", lw=1, label=f"{name} (greedy)")
    if heldout:
        axes.axhline(heldout[0].headline["chance"], color="grey", ls=":", label="chance")
    axes.set_ylabel("held-out accuracy")
    axes.set_xlabel("wall clock since training started (s)")
    axes.set_ylim(0, 1)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize="small")


def _greedy_of(result: RoundResult, domain: str) -> float | None:
    for line in result.domains:
        if line["domain"] == domain:
            return float(line["greedy_accuracy"])
    return None
