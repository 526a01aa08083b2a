"""Rates and means with their 95% intervals, and latency percentiles.

An evaluation compares policies on a few hundred problems, where a point estimate alone
hides whether a change is real.  Rates over independent trials get Wilson's interval
(well behaved near 0 and 1, unlike the normal approximation); means over problems get a
percentile bootstrap, seeded so the same report is produced twice from the same data.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

#: Draws of resampled indices held in memory at once: bounds a bootstrap over many
#: problems (a pooled report) to a few megabytes.
_CHUNK_DRAWS = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Interval:
    """A rate or a mean with its interval; ``n == 0`` means there was nothing to measure."""

    value: float
    low: float
    high: float
    n: int

    def to_json(self) -> dict[str, float | int]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Interval:
        return cls(
            value=float(data["value"]),
            low=float(data["low"]),
            high=float(data["high"]),
            n=int(data["n"]),
        )


def wilson(successes: int, n: int, z: float = 1.96) -> Interval:
    """Wilson score interval of ``successes`` out of ``n`` trials."""
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n} trials")
    if n == 0:
        return Interval(value=0.0, low=0.0, high=1.0, n=0)
    p = successes / n
    scale = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n)) / scale
    return Interval(value=p, low=max(0.0, centre - half), high=min(1.0, centre + half), n=n)


def bootstrap_mean(
    values: Sequence[float], resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> Interval:
    """Percentile bootstrap interval of the mean of ``values``; empty gives ``n == 0``."""
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")
    if not values:
        return Interval(value=0.0, low=0.0, high=0.0, n=0)
    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = np.concatenate([data[rows].mean(axis=1) for rows in _draws(rng, len(data), resamples)])
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    value = float(data.mean())
    # The percentile interval need not contain the estimate on skewed data; a reader
    # expects low <= value <= high.
    return Interval(
        value=value, low=min(float(low), value), high=max(float(high), value), n=len(data)
    )


def bootstrap_ratio(
    numerators: Sequence[float],
    denominators: Sequence[float],
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Interval | None:
    """``sum(numerators) / sum(denominators)`` (a cost per success: every trial's cost
    over the successes) with a percentile bootstrap over the paired trials; ``None`` when
    the denominators sum to zero.  A resample without a success has no ratio and is left
    out, so on very few successes the interval is conditional on at least one."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerators for {len(denominators)} denominators")
    top = np.asarray(numerators, dtype=np.float64)
    bottom = np.asarray(denominators, dtype=np.float64)
    if not bottom.sum():
        return None
    rng = np.random.default_rng(seed)
    ratios = []
    for rows in _draws(rng, len(top), resamples):
        under = bottom[rows].sum(axis=1)
        kept = under > 0
        ratios.append(top[rows].sum(axis=1)[kept] / under[kept])
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(np.concatenate(ratios), [tail, 1.0 - tail])
    value = float(top.sum() / bottom.sum())
    return Interval(
        value=value, low=min(float(low), value), high=max(float(high), value), n=len(top)
    )


def _draws(rng: np.random.Generator, n: int, resamples: int) -> Iterator[npt.NDArray[np.int64]]:
    rows = max(1, _CHUNK_DRAWS // n)
    for start in range(0, resamples, rows):
        yield rng.integers(0, n, size=(min(rows, resamples - start), n))


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    """``{"p50": ..., "p95": ..., "p99": ...}`` by linear interpolation; empty gives ``{}``."""
    if not values:
        return {}
    for q in qs:
        if not 0 <= q <= 100:
            raise ValueError(f"percentile {q} is outside 0..100")
    found = np.percentile(np.asarray(values, dtype=np.float64), list(qs), method="linear")
    return {f"p{q:g}": float(v) for q, v in zip(qs, found, strict=True)}


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Chance that one of ``k`` samples drawn from ``n`` (``correct`` right) is right."""
    if n - correct < k:
        return 1.0 if correct else 0.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)
