"""The zygote: where every run's process comes from (see the comment below)."""

from __future__ import annotations

import errno
import gc
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from .child import RunKit, run_child
from .common import HEADER, IO_TIMEOUT_S, MAX_PLAN_CHUNK, READ_CHUNK, RUN_PIPES
from .forks import SPARE_PID, MiddleFork, SiblingFork
from .libc import PR_SET_DUMPABLE, PR_SET_PDEATHSIG, prctl
from .processes import being_killed, close_all, helper_nice, running_child, signal_quietly

#
# A run's process is never a fork of the agent: the agent's heap still holds earlier
# requests (code, files, output) after they are freed, and a fork would hand them to
# the next task.  The zygote is forked from the agent before the agent reads any
# request (or exec-ed afresh when it must be replaced), and never reads one itself:
# it forks "spares", copies of its clean, preloaded interpreter, each waiting for one
# run.  The agent sends a spare the run's plan and pipes over a socket pair, and the
# spare becomes the run: its memory holds that run's plan and nothing earlier.
#
# A spare is the agent's own child, so the agent waits for it and kills its group as
# for a child it forked itself: the zygote forks it with clone(CLONE_PARENT) (see
# SiblingFork), or where that is unsure forks twice over and lets the middle process
# exit, so that the spare goes to the agent (PID 1, or a subreaper).  Spares are
# asked for once a reply is out, so a run pays for handing its plan over, not for a
# fork: up to SPARES after a reset (or any request but a run), and after a run only
# if none is left, so that a reset right behind a run finds no fork under way.
#
# The zygote lowers its priority to --run-nice (19 in a container), and spares and runs
# inherit it: within the container, whose CPU share against other containers is its
# cgroup's and unchanged by nice values, the agent then runs the moment it wakes, ahead
# of the code it serves and of the next spare's fork.  At equal priority a request
# waited about a millisecond on a busy machine for those to yield.  Where the sandbox has
# no cgroup of its own (no container, or bubblewrap, which the local backend runs with
# --run-nice 0) runs keep the agent's priority: there a nice value would rank them below
# every process of the host.
#
# Zygote and spares run as the code's uid.  They are not dumpable, so code can neither
# ptrace them nor write into them through /proc/<pid>/mem (and plant code in later
# runs); a spare turns dumpable once it holds its own run only.  What code can still
# do to them is signal them: a stopped one is continued before use, a dead one is
# replaced.

ZYGOTE_FLAG = "--zygote"
#: Where an exec-ed zygote finds its control socket.
ZYGOTE_FD = 3
#: How long the agent waits for the zygote's answer (a fork or two; an exec-ed start-up).
SPARE_WAIT_S = 5.0
#: Spares kept ready: a run takes one and leaves another, so the reset that follows a
#: run never waits for a fork (it must know every helper before strays are killed).
SPARES = 2
#: Spares a run may try before it gives up: a stray may have killed the ready ones.
TAKE_TRIES = SPARES + 2
#: The agent's package directory: ``python3 <it>`` runs its __main__ (a fresh zygote).
AGENT_DIR = os.path.dirname(os.path.abspath(__file__))


def zygote_main(ctl: socket.socket, agent_pid: int, nice: int) -> NoReturn:
    """Fork a spare for each byte the agent sends on ctl; exit when it hangs up."""
    prctl(PR_SET_DUMPABLE, 0)  # first thing: inherited when forked, not when exec-ed
    os.setpriority(os.PRIO_PROCESS, 0, helper_nice(os.getpriority(os.PRIO_PROCESS, 0), nice))
    if prctl(PR_SET_PDEATHSIG, signal.SIGKILL) and os.getppid() != agent_pid:
        os._exit(0)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)  # no Python handler that a stray's signal could run
    fork_sibling: Callable[[], int] = SiblingFork.probe() or MiddleFork()
    kit = RunKit.make()
    gc.freeze()  # spares then never copy the zygote's objects in a GC pass
    while True:
        try:
            if not ctl.recv(1):
                break
            pid, chan = _fork_spare(fork_sibling, ctl, kit)
            if chan is None:
                ctl.sendall(SPARE_PID.pack(0))  # none this time (fork failed: the pids limit)
                continue
            with chan:
                socket.send_fds(ctl, [SPARE_PID.pack(pid)], [chan.fileno()])
        except OSError:
            break
    os._exit(0)


def _fork_spare(
    fork_sibling: Callable[[], int], ctl: socket.socket, kit: RunKit
) -> tuple[int, socket.socket | None]:
    """Fork a spare that is the agent's child: its pid and the agent's end of its socket pair."""
    ours, theirs = socket.socketpair()
    try:
        spare = fork_sibling()
    except OSError:
        ours.close()
        theirs.close()
        return 0, None
    if spare == 0:
        ctl.close()
        ours.close()
        spare_main(theirs, kit)
    theirs.close()
    return spare, ours


def spare_main(chan: socket.socket, kit: RunKit) -> NoReturn:
    """Wait for one run (its plan and pipes), then become it; exit if the agent hangs up."""
    try:
        received = _receive_run(chan)
    except (OSError, ValueError):
        received = None
    if received is None:
        os._exit(0)
    run_child(*received, inherited=(chan,), kit=kit)


def _receive_run(chan: socket.socket) -> tuple[bytes, list[int]] | None:
    """A run's framed plan and its pipes; None when the agent hung up first."""
    data, fds, _, _ = socket.recv_fds(chan, READ_CHUNK, len(RUN_PIPES))
    if not data:
        return None
    if len(fds) != len(RUN_PIPES):
        raise ValueError(f"{len(fds)} descriptors with the plan, not {len(RUN_PIPES)}")
    buf = bytearray(data)
    while len(buf) < HEADER.size or len(buf) < HEADER.size + HEADER.unpack_from(buf)[0]:
        more = chan.recv(MAX_PLAN_CHUNK)
        if not more:
            raise ValueError("the plan was cut short")
        buf += more
    (length,) = HEADER.unpack_from(buf)
    return bytes(buf[HEADER.size : HEADER.size + length]), fds


def _exec_zygote(ctl: socket.socket, agent_pid: int, nice: int) -> NoReturn:
    """In a fork of the agent: replace its image (earlier requests in its heap) by a zygote."""
    try:
        os.dup2(ctl.fileno(), ZYGOTE_FD)
        os.set_inheritable(ZYGOTE_FD, True)
        os.closerange(ZYGOTE_FD + 1, max(os.sysconf("SC_OPEN_MAX"), 1024))
        flags = ["-B"] if sys.dont_write_bytecode else []
        argv = [sys.executable, *flags, AGENT_DIR, ZYGOTE_FLAG, str(agent_pid), str(nice)]
        os.execv(sys.executable, argv)
    finally:
        os._exit(127)


@dataclass(slots=True)
class Spare:
    pid: int
    chan: socket.socket


class Zygote:
    """The agent's side of its zygote, and of the spares it holds ready."""

    def __init__(self, nice: int) -> None:
        self.nice = nice
        self.pid = 0
        self.ctl: socket.socket | None = None
        #: Ready spares, oldest first.
        self.spares: list[Spare] = []
        #: Spares asked for whose answer is not read yet.
        self.asked = 0
        #: False for a zygote exec-ed while a task's processes may live: they could write
        #: into it before it made itself non-dumpable.  Reset replaces it.
        self.trusted = True

    def start(self, fresh: bool, trusted: bool = True) -> None:
        """Fork the zygote (only while the agent has read no request), or exec a fresh one."""
        ours, theirs = socket.socketpair()
        agent = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            raise
        if pid == 0:
            ours.close()
            if fresh:
                _exec_zygote(theirs, agent, self.nice)
            zygote_main(theirs, agent, self.nice)
        theirs.close()
        self.pid, self.ctl, self.asked, self.trusted = pid, ours, 0, trusted

    def pids(self) -> frozenset[int]:
        """The live helper processes: the zygote and the spares."""
        return frozenset(p for p in (self.pid, *(s.pid for s in self.spares)) if p)

    def ask(self, ready: int = SPARES) -> None:
        """Have spares made now (while the agent answers the host) until ``ready`` are
        ready or under way."""
        missing = ready - len(self.spares) - self.asked
        if missing <= 0 or self.ctl is None:
            return
        signal_quietly(self.pid, signal.SIGCONT)  # a stray may have stopped it
        try:
            self.ctl.send(b"s" * missing)  # one fork per byte
        except OSError:
            self._lost()
            return
        self.asked += missing

    def launch(self, plan: bytes, fds: list[int]) -> int:
        """Hand a run's plan and pipes to a spare; its pid.  OSError if no spare would take it."""
        frame = HEADER.pack(len(plan)) + plan
        spare = self._take()
        try:
            sent = self._send_pipes(spare, frame, fds)
        except OSError:  # it died waiting (a stray's signal), nothing delivered: a new one
            spare = self._take()
            sent = self._send_pipes(spare, frame, fds)
        with spare.chan:  # once it has the pipes, never another: it may be running already
            if sent < len(frame):
                spare.chan.sendall(memoryview(frame)[sent:])
        return spare.pid

    def settle(self) -> None:
        """Read the answer under way, so every helper process is known (before strays die)."""
        if self.asked:
            try:
                self._collect()
            except OSError:
                self._lost()

    def refresh(self) -> None:
        """At reset, no task process left: replace a lost or untrusted zygote."""
        if self.ctl is None or not self.trusted:
            self.stop()
            self.start(fresh=True)

    def reaped(self, pid: int) -> None:
        """A child of the agent was reaped: forget it if it was ours."""
        if pid == self.pid:
            self.pid = 0
            self._lost()
        else:
            for spare in [s for s in self.spares if s.pid == pid]:
                spare.chan.close()
                self.spares.remove(spare)

    def stop(self) -> None:
        """Kill the zygote and the spares (the agent reaps them)."""
        for spare in self.spares:
            signal_quietly(spare.pid, signal.SIGKILL)
            spare.chan.close()
        self.spares = []
        self._lost()

    # -- internals

    def _take(self) -> Spare:
        # A stray's SIGKILL is delivered when the spare next runs: on a busy machine that
        # can be after its run's pipes went to it, and the run would die unrun.
        for _ in range(TAKE_TRIES):
            spare = self._take_any()
            if not being_killed(spare.pid):
                signal_quietly(spare.pid, signal.SIGCONT)  # a stray may have stopped it
                return spare
            spare.chan.close()  # the agent reaps it once it is gone
        raise OSError(errno.EAGAIN, "every spare was killed before it could take the run")

    def _take_any(self) -> Spare:
        if not self.spares:
            try:
                self._make_spare()
            except OSError:
                # The zygote died under us (a stray killed it before we reaped it): once
                # more, from a fresh one.
                self._lost()
                self._make_spare()
        if not self.spares:
            raise OSError(errno.EAGAIN, "the zygote could not fork (the pids limit?)")
        return self.spares.pop(0)

    def _make_spare(self) -> None:
        if self.ctl is not None and being_killed(self.pid):
            self._lost()
        if self.ctl is None:  # it died (a stray killed it): a fresh one, clean by exec
            self.start(fresh=True, trusted=False)
        self.ask(1)
        if self.ctl is None:  # the ask found it gone
            raise ConnectionResetError(errno.ECONNRESET, "the zygote hung up")
        try:
            self._collect()
        except OSError:
            self._lost()
            raise

    @staticmethod
    def _send_pipes(spare: Spare, frame: bytes, fds: list[int]) -> int:
        """Send the pipes with what of the frame fits; closes the spare's socket on failure."""
        try:
            spare.chan.settimeout(IO_TIMEOUT_S)
            return socket.send_fds(spare.chan, [frame], fds)
        except OSError:
            spare.chan.close()
            raise

    def _collect(self) -> None:
        """Read the zygote's answers to what was asked: a fork or two away."""
        assert self.ctl is not None
        signal_quietly(self.pid, signal.SIGCONT)  # a stray may have stopped it
        self.ctl.settimeout(SPARE_WAIT_S)
        while self.asked:
            data, fds, _, _ = socket.recv_fds(self.ctl, SPARE_PID.size, 1)
            self.asked -= 1
            if len(data) != SPARE_PID.size:
                close_all(fds)
                raise ConnectionResetError(errno.ECONNRESET, "the zygote hung up")
            pid = SPARE_PID.unpack(data)[0]
            # A stray may have killed it between its fork and now: a dead pid kept as a
            # helper would shield whatever process later reuses that pid from reset.
            if pid and len(fds) == 1 and running_child(pid):
                self.spares.append(Spare(pid, socket.socket(fileno=fds[0])))
            else:
                close_all(fds)

    def _lost(self) -> None:
        """Drop the zygote (killed first: it may be alive but out of step)."""
        if self.pid:
            signal_quietly(self.pid, signal.SIGKILL)
        if self.ctl is not None:
            self.ctl.close()
        self.pid, self.ctl, self.asked = 0, None, 0
