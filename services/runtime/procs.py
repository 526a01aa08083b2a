"""Child-process helpers: children die with their parent, and are ended by pid only."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask the kernel to SIGTERM this child when its parent dies (Linux).

    Without it a supervisor killed with SIGKILL would leave nats-server and the
    services running.
    """
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    libc = ctypes.CDLL(libc_name, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def child_preexec() -> Callable[[], None] | None:
    return _die_with_parent if sys.platform.startswith("linux") else None


def terminate(proc: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL.  Returns the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    return proc.wait()
