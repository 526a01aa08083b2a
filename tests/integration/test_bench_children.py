"""A benchmark stopped with ``kill PID`` takes its children with it (bench/children.py):
proven by killing a real process that runs a real child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"

#: A stand-in bench: the child writes its pid, then would run for two minutes.
SCRIPT = """
import sys
sys.path.insert(0, {bench!r})
import children
{install}
child = "import os, time; open({pidfile!r}, 'w').write(str(os.getpid())); time.sleep(120)"
children.run([sys.executable, "-c", child])
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stopped_bench(tmp_path: Path, install: str) -> tuple[int, int]:
    """Start the stand-in, SIGTERM it once its child runs: (its status, the child's pid)."""
    pidfile = tmp_path / "child.pid"
    script = SCRIPT.format(bench=str(BENCH), install=install, pidfile=str(pidfile))
    bench = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and bench.poll() is None, "the child never started"
        time.sleep(0.05)
    os.kill(bench.pid, signal.SIGTERM)
    return bench.wait(30), int(pidfile.read_text())


def test_a_stopped_bench_stops_its_child(tmp_path: Path) -> None:
    status, child = _stopped_bench(tmp_path, "children.exit_on_term()")
    assert status == 128 + signal.SIGTERM
    assert not _alive(child)


def test_without_it_the_child_is_orphaned(tmp_path: Path) -> None:
    """What the handler is for: by default the child outlives the bench."""
    status, child = _stopped_bench(tmp_path, "")
    try:
        assert status == -signal.SIGTERM
        assert _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
