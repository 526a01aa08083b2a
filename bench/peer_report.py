"""What the TRL side-by-side benchmarks print: both sides' figures, where Temper's time
went, and the two goals (issues 11 and 12), as figures, never assertions."""

from __future__ import annotations

import json
import statistics

from peer_run import Comparison, Matched, Side
from stack_figures import service_lines

#: The goals: Temper's trained samples/s over TRL's, and its share of TRL's time to TRL's
#: final held-out accuracy.
RATE_GOAL, TIME_GOAL = 1.5, 0.5


def print_runs(result: Comparison, settings: Matched, accuracy: str) -> None:
    """TRL's spec (less its rows), the settings both share, and each side's figures."""
    shown = {key: value for key, value in result.spec.items() if key != "train"}
    print(f"TRL's spec ({len(result.spec['train'])} train rows not shown): {json.dumps(shown)}")
    print(f"matched: {settings.describe()}")
    for side in (result.trl, result.temper):
        print_side(side, accuracy)


def print_side(side: Side, what: str) -> None:
    first = statistics.fmean(side.rewards[:10]) if side.rewards else 0.0
    last = statistics.fmean(side.rewards[-10:]) if side.rewards else 0.0
    print(
        f"{side.name:>7}: {side.steps} optimizer steps in {_batches(side.batches)}, "
        f"{side.samples} samples in {side.seconds:.0f} s = {side.rate:.1f} trained samples/s; "
        f"train reward {first:.3f} -> {last:.3f} (first and last 10 batches)"
    )
    curve = ", ".join(f"{t:.0f}s {a:.1%}" for t, a in side.curve)
    print(f"{'':>9}{what}: {curve}")


def _batches(count: int) -> str:
    return f"{count} batch" if count == 1 else f"{count} batches"


def print_stack(result: Comparison, batch: int) -> None:
    """Where Temper's time went: CPU by process, the learner's step, the services' stages."""
    total = sum(result.cpu.values()) or 1.0
    shares = ", ".join(
        f"{name} {used:.0f} s ({used / total:.0%})" for name, used in result.cpu.items()
    )
    print(f"Temper CPU by process: {shares}")
    stages = dict(result.stages)
    cycle = stages.pop("cycle", 0.0)
    parts = ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in stages.items())
    print(f"Temper learner step: {cycle * 1000:.0f} ms between steps; {parts}")
    for line in service_lines(result.run_dir, batch):
        print(f"Temper {line}")


def print_goals(result: Comparison, accuracy: str) -> None:
    """Time to TRL's final ``accuracy``, the gains, the samples/s ratio and both goals."""
    trl, temper = result.trl, result.temper
    reached = time_to_peer(trl.curve, temper.curve, window=1, label=f"TRL's final {accuracy}")
    # One evaluation swings 10-20 points between versions a minute apart: the same
    # comparison on running means of three evaluations is less at the mercy of one.
    time_to_peer(trl.curve, temper.curve, window=3, label="TRL's mean of its last 3 evaluations")
    gain = temper.curve[-1][1] - temper.curve[0][1] if temper.curve else 0.0
    peer_gain = trl.curve[-1][1] - trl.curve[0][1] if trl.curve else 0.0
    print(
        f"{accuracy} gain over the start: Temper {100 * gain:+.1f} points, "
        f"TRL {100 * peer_gain:+.1f}"
    )
    ratio = temper.rate / max(trl.rate, 1e-9)
    print(f"e2e samples/s ratio temper/trl: {ratio:.2f}")
    print(f"goal: Temper's trained samples/s >= {RATE_GOAL}x TRL's: {ratio:.2f}x")
    share = "not reached" if reached is None else f"{reached:.2f} of TRL's time"
    print(
        f"goal: Temper reaches TRL's final {accuracy} in <= {TIME_GOAL:.0%} of TRL's time: {share}"
    )


def time_to_peer(
    peer: list[tuple[float, float]], ours: list[tuple[float, float]], window: int, label: str
) -> float | None:
    """When ``ours`` (as running means of ``window`` evaluations) first reaches the peer's
    final level (the mean of its last ``window``), against the peer's own time to it;
    returns that share of the peer's time (None: not reached, or too few evaluations)."""
    if len(peer) < window or len(ours) < window:
        print(f"too few evaluations for {label}")
        return None
    target = statistics.fmean(a for _, a in peer[-window:])
    smoothed = [
        (ours[i][0], statistics.fmean(a for _, a in ours[i - window + 1 : i + 1]))
        for i in range(window - 1, len(ours))
    ]
    reached = next((t for t, a in smoothed if a >= target), None)
    if reached is None:
        print(f"Temper never reached {label} ({target:.1%})")
        return None
    peer_s = peer[-1][0]
    ratio = reached / max(peer_s, 1e-9)
    print(
        f"time to {label} ({target:.1%}): Temper {reached:.0f} s, TRL {peer_s:.0f} s "
        f"(ratio {ratio:.2f}, goal <= {TIME_GOAL:.2f})"
    )
    return ratio
