"""Where a service's time goes: seconds and counts per named stage.

A learner step keeps one per step; a long-running service keeps one for its life and
publishes the totals with its stats (``time_<stage>_s`` and ``count_<stage>``), so a
benchmark or an operator can divide them by the work done.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Stages:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.counts[name] = self.counts.get(name, 0) + 1

    def figures(self) -> dict[str, float]:
        """The totals as stats values."""
        values = {f"time_{name}_s": seconds for name, seconds in self.seconds.items()}
        values.update({f"count_{name}": float(count) for name, count in self.counts.items()})
        return values
