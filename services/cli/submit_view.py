"""What ``temper submit --wait`` shows while it waits: each new result, and progress."""

from __future__ import annotations

import sys
import time
from typing import Any, Final, TextIO

from tqdm import tqdm

from protocol.client import Progress
from protocol.messages import ScoredRollout

#: Where stderr is not a terminal, a progress line this often (only as results arrive).
LINE_EVERY_S: Final = 15.0


def result_line(scored: ScoredRollout) -> str:
    return f"scored {scored.id} reward={scored.reward:.4f} status={scored.status.value}"


class WaitView:
    """Prints each result on stdout as it arrives.  Progress goes to stderr: a bar on a
    terminal, else a line every :data:`LINE_EVERY_S` seconds, so that stdout stays one
    line per result for the programs that read it."""

    def __init__(
        self, start: Progress, err: TextIO | None = None, line_every_s: float = LINE_EVERY_S
    ) -> None:
        self._err = err or sys.stderr
        self._line_every_s = line_every_s
        self._started = time.monotonic()
        self._printed = self._started
        self._bar: tqdm[Any] | None = None
        if self._err.isatty():
            self._bar = tqdm(
                total=start.expected,
                initial=start.scored,
                desc="scored",
                unit="sample",
                file=self._err,
                dynamic_ncols=True,
            )

    def result(self, scored: ScoredRollout, progress: Progress) -> None:
        if self._bar is None:
            print(result_line(scored), flush=True)  # each result at once, not when --wait ends
            self._line(progress)
            return
        # tqdm.write keeps the bar intact below the line.
        tqdm.write(result_line(scored), file=sys.stdout)
        self._bar.n = progress.scored
        self._bar.set_postfix_str(f"{progress.tasks_done}/{progress.tasks} tasks", refresh=False)
        self._bar.refresh()

    def _line(self, progress: Progress) -> None:
        now = time.monotonic()
        if now - self._printed < self._line_every_s:
            return
        self._printed = now
        print(
            f"temper: {progress.scored} of {progress.expected} samples scored, "
            f"{progress.tasks_done} of {progress.tasks} tasks complete "
            f"({now - self._started:.0f}s)",
            file=self._err,
            flush=True,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
