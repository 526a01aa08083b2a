"""Processes: reaping, killing strays, telling a live helper from a dead one."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator

from .common import KILL_WAIT_S


def signal_quietly(pid: int, sig: int, group: bool = False) -> bool:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def reap_children(keep: int = 0) -> list[int]:
    """Reap exited children without blocking, never ``keep``; the pids reaped.

    ``keep`` is a running exec's leader: unreaped, it holds its process group id, so
    killing the group can never hit a recycled id.  Children queue oldest first, so
    one behind an exited leader waits for the next call (once that exec is over).
    As PID 1 (or a subreaper) the agent inherits every orphan of the sandbox: this
    is the init's duty of reaping them.
    """
    reaped: list[int] = []
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid in (0, keep):
            return reaped
        os.waitpid(info.si_pid, 0)
        reaped.append(info.si_pid)


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            line = f.read()
    except OSError:
        return None
    return line[line.rfind(b")") + 2 :][:1].decode() or None


def live_strays(spared: frozenset[int]) -> Iterator[int]:
    """Every live (non-zombie) process in our PID namespace but PID 1 and ``spared``.

    Only used with --container, where the namespace is the sandbox's own.
    """
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != 1 and int(name) not in spared:
            state = _proc_state(int(name))
            if state is not None and state not in ("Z", "X"):
                yield int(name)


def kill_strays(
    spared: frozenset[int] = frozenset(),
    on_reaped: Callable[[int], None] | None = None,
    deadline_s: float = KILL_WAIT_S,
) -> tuple[int, bool]:
    """SIGKILL every stray until none is left: (distinct pids killed, all gone).

    The agent itself is always spared; ``spared`` adds its helpers (zygote, spares).
    ``on_reaped`` hears of every child reaped meanwhile.
    """
    spared |= {os.getpid()}
    killed = set[int]()
    end = time.monotonic() + deadline_s
    while True:
        alive = list(live_strays(spared))
        if not alive:
            return len(killed), True
        for pid in alive:
            if signal_quietly(pid, signal.SIGKILL):
                killed.add(pid)
        for pid in reap_children():
            if on_reaped is not None:
                on_reaped(pid)
        if time.monotonic() > end:
            return len(killed), False
        time.sleep(0.001)


def running_child(pid: int) -> bool:
    """Whether ``pid`` is a child of this process that has not exited (one that has is
    reaped here; one reaped already is no child any more)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


#: The bit of SIGKILL in /proc/<pid>/status's pending-signal masks.
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def being_killed(pid: int) -> bool:
    """Whether our child ``pid`` has a SIGKILL pending (sent, not yet acted on) or is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except FileNotFoundError:  # gone, or no /proc to tell: ask the kernel as its parent
        return not running_child(pid)
    except OSError:
        return False
    return pending_signals(status) & _SIGKILL_BIT != 0


def pending_signals(status: bytes) -> int:
    """The union of a /proc/<pid>/status's thread and process pending-signal masks."""
    mask = 0
    for line in status.splitlines():
        if line.startswith((b"SigPnd:", b"ShdPnd:")):
            mask |= int(line.split(b":", 1)[1], 16)
    return mask


def close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


#: A process's (nice value, scheduling policy, CPU affinity).
SchedState = tuple[int, int, frozenset[int]]


def helper_nice(own: int, run_nice: int) -> int:
    """The zygote's nice value: ``run_nice``, unless the agent's own is higher already."""
    return max(own, run_nice)


def helper_sched(agent: SchedState | None, run_nice: int) -> SchedState | None:
    if agent is None:
        return None
    nice, policy, cpus = agent
    return helper_nice(nice, run_nice), policy, cpus


def sched_state(pid: int) -> SchedState | None:
    """A process's (nice value, scheduling policy, CPU affinity); None once it is gone."""
    try:
        return (
            os.getpriority(os.PRIO_PROCESS, pid),
            os.sched_getscheduler(pid),
            frozenset(os.sched_getaffinity(pid)),
        )
    except OSError:
        return None


def open_pipes(count: int) -> list[tuple[int, int]]:
    """count pipes (close-on-exec), or none at all (OSError, e.g. EMFILE)."""
    pipes: list[tuple[int, int]] = []
    try:
        for _ in range(count):
            pipes.append(os.pipe())
    except OSError:
        for pair in pipes:
            for fd in pair:
                os.close(fd)
        raise
    return pipes
