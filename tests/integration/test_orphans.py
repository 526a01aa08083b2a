"""A worker dies with its parent (services/runtime/orphans.py), proven with ``kill -9``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.test_supervisor import alive

REPO = Path(__file__).resolve().parents[2]

#: The parent starts a child in a session of its own (as torchrun starts a rank), prints
#: the child's pid, and waits forever.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""

#: Says "watching" (on the parent's stdout, which it inherits) once the watch is on.
CHILD = """
import time
from services.runtime.orphans import exit_with_parent
exit_with_parent("test child")
print("watching", flush=True)
time.sleep(600)
"""


def _family(child_code: str, lines: int = 1) -> tuple[subprocess.Popen[str], int]:
    """The parent and its child's pid, once ``lines`` lines are out (the pid, and the
    child's own when it says it is ready)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, child_code],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    said = [parent.stdout.readline().strip() for _ in range(lines)]
    return parent, int(next(line for line in said if line.isdigit()))


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_watched_child_dies_when_its_parent_is_killed() -> None:
    parent, child = _family(CHILD, lines=2)
    assert alive(child)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert _gone_within(child, 10), "the child outlived its parent"


def test_an_unwatched_child_outlives_its_parent() -> None:
    """The control: without the watch the orphan runs on, which is what the watch is for."""
    parent, child = _family("import time; time.sleep(600)")
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    try:
        assert not _gone_within(child, 1.5)
    finally:
        os.kill(child, signal.SIGKILL)
