"""End a worker process when the process that started it is gone.

torchrun starts each rank in a session of its own, so a ``kill -9`` of torchrun (or of
whatever supervises it) reaches no rank: rank 0 would go on taking batches and
publishing weights with nobody left to stop it.  A rank therefore watches its parent
through a pidfd, which becomes readable when that process exits: no polling, no signal
from a thread that might end first.
"""

from __future__ import annotations

import os
import select
import signal
import threading

from services.runtime.logs import get_logger

_log = get_logger(component="orphans")


def exit_with_parent(what: str) -> threading.Thread | None:
    """Kill this process (SIGKILL, as its parent's death left it) once the parent exits.
    Returns the watching thread, or None where pidfds are missing (not Linux)."""
    if not hasattr(os, "pidfd_open"):
        return None
    parent = os.getppid()
    fd = os.pidfd_open(parent)
    if os.getppid() != parent:  # it ended before the pidfd was open
        _orphaned(what, parent)
    thread = threading.Thread(target=_watch, args=(fd, what, parent), daemon=True)
    thread.name = f"parent-watch-{parent}"
    thread.start()
    return thread


def _watch(fd: int, what: str, parent: int) -> None:
    select.select([fd], [], [])
    _orphaned(what, parent)


def _orphaned(what: str, parent: int) -> None:
    _log.error("parent_exited", process=what, parent=parent, pid=os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
