"""The processes a benchmark starts end with it.

A benchmark stopped with ``kill PID`` (SIGTERM) dies at once by default and leaves its
children running: TRL's runner or ``temper train`` would train on, orphaned, for the rest
of their budget and take the CPU from whatever is measured next.  Here SIGTERM becomes
``SystemExit`` and every child is stopped the way a user would stop it (SIGTERM: ``temper``
stops its own services), then killed if it lingers.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

#: How long a stopped child may take to stop its own services before it is killed.
STOP_GRACE_S = 60.0


def exit_on_term() -> None:
    """SIGTERM raises ``SystemExit(143)`` in the main thread, so that the children below
    are stopped on the way out."""

    def stop(signum: int, _: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def run(command: Sequence[str], *, check: bool = True, **popen: Any) -> Any:
    """``subprocess.run`` whose child is stopped, not orphaned, when the bench stops;
    the child's stdout when it is piped."""
    with subprocess.Popen(list(command), **popen) as proc, stopped_on_exit(proc):
        out, _ = proc.communicate()
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, list(command))
    return out


@contextlib.contextmanager
def stopped_on_exit(proc: subprocess.Popen[Any]) -> Iterator[subprocess.Popen[Any]]:
    """Stop ``proc`` (SIGTERM, then SIGKILL after the grace) if the block raises."""
    try:
        yield proc
    except BaseException:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise
