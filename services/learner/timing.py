"""Where a learner step's time goes: named stages, accumulated per step."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Stages:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
