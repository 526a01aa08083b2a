"""What every measuring section of ``gpu_check`` shares: the plan, rounds, the result."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from services.runtime.stages import Stages

#: Timed rounds per section at most (a fast section stops here, well inside its box).
MAX_ROUNDS = 25


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Sizes and time boxes of one kind of run."""

    name: str
    layers: int
    hidden: int
    #: Seconds of timed rounds per measuring section (its set-up comes on top).
    section_s: float
    #: Generator workload: prompts in flight at once, their length, new tokens each.
    prompts: int
    prompt_tokens: int
    new_tokens: int
    #: Learner samples per step (whole groups of ``bench_learner``'s batch, at most 256).
    batch: int
    train_minutes: float
    #: Extra ``temper train`` options and environment.
    train_args: tuple[str, ...] = ()
    train_env: dict[str, str] = field(default_factory=dict)
    #: ``temper train`` starts from the check's model instead of building and warming up
    #: its own (the quick run: the same tiny shape, no warm-up).
    train_from_check_model: bool = False
    #: Torch threads of the measuring sections; 0 keeps torch's default (every core).
    threads: int = 0


@dataclass(frozen=True, kw_only=True)
class Plan:
    profile: Profile
    device: torch.device
    dtype: torch.dtype
    sections: tuple[str, ...]
    out: Path
    deadline: float

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def sync(self) -> None:
        """Wait for the device's queued work: a clock stopped before it would lie."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One section's figure per round: ours against the baseline."""

    section: str
    unit: str
    higher_is_better: bool
    ours: list[float]
    baseline: list[float]
    #: What each side is, and lines of detail printed before the result.
    ours_name: str
    baseline_name: str
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return statistics.median(self.ours) / statistics.median(self.baseline)

    @property
    def ok(self) -> bool:
        return bool(self.ours) and bool(self.baseline)

    def lines(self) -> list[str]:
        better = "higher" if self.higher_is_better else "lower"
        rows = [
            f"  {name:<34}{self.unit}: median {fig(statistics.median(values))}, "
            f"range {fig(min(values))}-{fig(max(values))} ({len(values)} rounds)"
            for name, values in ((self.ours_name, self.ours), (self.baseline_name, self.baseline))
        ]
        result = (
            f"RESULT {self.section}: ours {fig(statistics.median(self.ours))} {self.unit}, "
            f"baseline {fig(statistics.median(self.baseline))} {self.unit}, "
            f"ratio ours/baseline {self.ratio:.2f} ({better} is better, {len(self.ours)} rounds)"
        )
        return [*(f"  {n}" for n in self.notes), *rows, result]

    def summary(self) -> str:
        better = "higher" if self.higher_is_better else "lower"
        return (
            f"{self.section:<12} {self.ratio:>6.2f}  ours {fig(statistics.median(self.ours))}"
            f" vs {fig(statistics.median(self.baseline))} {self.unit} ({better} is better)"
        )


def fig(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


# ---------------------------------------------------------------- rounds


def alternate(
    ours: Callable[[int], float],
    baseline: Callable[[int], float],
    seconds: float,
    warmed: Callable[[], None] | None = None,
) -> tuple[list[float], list[float]]:
    """Round 0 of each untimed (first-call costs), then rounds 1, 2, ... alternating,
    while a next round still fits in ``seconds`` (at least one, at most ``MAX_ROUNDS``)."""
    ours(0)
    baseline(0)
    if warmed is not None:
        warmed()
    a: list[float] = []
    b: list[float] = []
    started = time.monotonic()
    while len(a) < MAX_ROUNDS:
        a.append(ours(len(a) + 1))
        b.append(baseline(len(b) + 1))
        spent = time.monotonic() - started
        if spent + spent / len(a) > seconds:
            break
    return a, b


def reset(*stages: Stages) -> None:
    """Forget the untimed round's stages."""
    for each in stages:
        each.seconds.clear()
        each.counts.clear()


def timed(plan: Plan, work: Callable[[], object]) -> float:
    """Milliseconds of ``work``, its device work included."""
    plan.sync()
    started = time.perf_counter()
    work()
    plan.sync()
    return (time.perf_counter() - started) * 1000


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
