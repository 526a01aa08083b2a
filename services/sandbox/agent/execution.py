"""One exec: feeding stdin, reading output, enforcing the deadline, the outcome."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import time
from typing import TYPE_CHECKING

from .child import ChildPlan
from .common import READ_CHUNK
from .processes import close_all, kill_strays, signal_quietly
from .protocol import ExecSpec, Outcome

if TYPE_CHECKING:
    from .server import Agent


#: After the main process exits, how long its descendants may keep the pipes open.
PIPE_GRACE_S = 0.05


class Cancelled(Exception):
    """The host closed the connection while the exec ran."""


STREAMS = ("stdout", "stderr")


class Execution:
    """One run: feed stdin, collect capped output, enforce the deadline, kill, reap.

    The pipes are watched by name ("stdin", "stdout", "stderr", "status", "pidfd") in
    ``fds``; a name leaves ``fds`` when its fd is closed.
    """

    def __init__(self, host: Agent, plan: ChildPlan, spec: ExecSpec, conn: socket.socket):
        self.host, self.plan, self.spec, self.conn = host, plan, spec, conn
        self.container = host.opts.container
        self.sel = selectors.DefaultSelector()
        self.fds: dict[str, int] = {}
        self.bufs = {name: bytearray() for name in STREAMS}
        self.truncated = dict.fromkeys(STREAMS, False)
        self.stdin_left = memoryview(spec.stdin)
        self.reason: str | None = None  # "timeout" | "output_limit" | "cancelled"
        self.setup_error = b""
        self.pid = 0
        self.exited_at: float | None = None
        self.polling = True

    def run(self, parent_ends: dict[str, int], child_ends: list[int]) -> Outcome:
        """parent_ends: our ends of the pipes by name; child_ends: the run's, in RUN_PIPES
        order (all fds are ours to close from here).

        Raises Cancelled when the host hung up; a run that cannot start is infra_error.
        """
        start = time.monotonic()
        try:
            self.pid = self.host.zygote.launch(self.plan.encode(), child_ends)
        except OSError as exc:  # EAGAIN: the pids limit
            self.sel.close()
            close_all([*child_ends, *parent_ends.values()])
            return Outcome("infra_error", error=f"cannot start the run: {exc}")
        try:
            close_all(child_ends)
            self._watch_all(parent_ends)
            self._loop(start + self.spec.timeout_s)
            duration = (self.exited_at or time.monotonic()) - start
            wait_status = self._stop()
        finally:
            self._abort()
        if self.reason == "cancelled":
            raise Cancelled
        return self._outcome(wait_status, duration)

    # -- setup

    def _watch(self, name: str, fd: int, events: int) -> None:
        os.set_blocking(fd, False)
        self.sel.register(fd, events, name)
        self.fds[name] = fd

    def _drop(self, name: str) -> None:
        fd = self.fds.pop(name)
        self.sel.unregister(fd)
        os.close(fd)

    def _watch_all(self, ends: dict[str, int]) -> None:
        for name in (*STREAMS, "status"):
            self._watch(name, ends[name], selectors.EVENT_READ)
        if self.stdin_left:
            self._watch("stdin", ends["stdin"], selectors.EVENT_WRITE)
        else:
            os.close(ends["stdin"])
        self.sel.register(self.conn, selectors.EVENT_READ, "conn")
        self.sel.register(self.host.wake_fd, selectors.EVENT_READ, "wake")
        try:
            self._watch("pidfd", os.pidfd_open(self.pid), selectors.EVENT_READ)
        except (AttributeError, OSError):  # old kernel or seccomp: poll waitid instead
            pass
        self.polling = "pidfd" not in self.fds

    # -- the loop

    def _loop(self, deadline: float) -> None:
        while self.reason is None:
            now = time.monotonic()
            if self.exited_at is not None:
                wake = self.exited_at + PIPE_GRACE_S
                if now >= wake or not any(s in self.fds for s in STREAMS):
                    return
            elif now >= deadline:
                self.reason = "timeout"
                return
            else:
                wake = deadline
            poll = self.polling and self.exited_at is None
            for key, _ in self.sel.select(min(wake - now, 0.002) if poll else wake - now):
                self._dispatch(key.data)
            if poll:
                self._check_exit()

    def _dispatch(self, name: str) -> None:
        if name in STREAMS:
            self._read_output(name)
        elif name == "stdin":
            self._write_stdin()
        elif name == "status":
            self._read_status()
        elif name == "pidfd":
            self._check_exit()
        elif name == "conn":
            self._check_conn()
        elif name == "wake":  # SIGCHLD: reap orphans now, not after the run (pids limit)
            self.host.on_wake(keep=self.pid)

    def _read_output(self, name: str) -> None:
        try:
            data = os.read(self.fds[name], READ_CHUNK)
        except BlockingIOError:
            return
        if not data:
            self._drop(name)
        elif not self._keep(name, data):
            self.reason = "output_limit"

    def _keep(self, name: str, data: bytes) -> bool:
        """Append within the cap; False (and the truncated flag) when data did not fit."""
        buf = self.bufs[name]
        room = self.spec.output_bytes - len(buf)
        buf += data[:room]
        if len(data) > room:
            self.truncated[name] = True
            return False
        return True

    def _write_stdin(self) -> None:
        try:
            n = os.write(self.fds["stdin"], self.stdin_left[:READ_CHUNK])
        except BlockingIOError:
            return
        except OSError:  # EPIPE: the child does not read its stdin
            n = len(self.stdin_left)
        self.stdin_left = self.stdin_left[n:]
        if not self.stdin_left:
            self._drop("stdin")

    def _read_status(self) -> None:
        try:
            data = os.read(self.fds["status"], 4096)
        except BlockingIOError:
            return
        if data:
            self.setup_error += data[:4096]
        else:
            self._drop("status")

    def _check_exit(self) -> None:
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT  # seen, not reaped: the pgid stays ours
        if os.waitid(os.P_PID, self.pid, flags) is not None:
            self.exited_at = time.monotonic()
            if "pidfd" in self.fds:
                self._drop("pidfd")

    def _check_conn(self) -> None:
        try:
            peek = self.conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            peek = b""
        if peek:  # a pipelined request: it waits its turn
            self.sel.unregister(self.conn)
        else:
            self.reason = "cancelled"

    # -- the end

    def _stop(self) -> int:
        """Kill the group (the leader, zombie or alive, still holds the pgid), then reap it."""
        signal_quietly(self.pid, signal.SIGKILL)
        signal_quietly(self.pid, signal.SIGKILL, group=True)
        _, status = os.waitpid(self.pid, 0)  # before kill_strays, which reaps any child
        self.pid = 0
        if self.container and (self.reason is not None or any(s in self.fds for s in STREAMS)):
            zygote = self.host.zygote
            zygote.settle()  # a spare forked meanwhile is a helper, not a stray
            kill_strays(zygote.pids(), zygote.reaped)
        self._drain()
        return status

    def _drain(self) -> None:
        """Read what the killed processes left in the pipes, within the caps."""
        for name in STREAMS:
            while name in self.fds and not self.truncated[name]:
                try:
                    data = os.read(self.fds[name], READ_CHUNK)
                except BlockingIOError:
                    break
                if not data:
                    break
                if not self._keep(name, data) and self.reason is None:
                    self.reason = "output_limit"

    def _abort(self) -> None:
        """Always: nothing of this exec stays open or running (also on errors and SIGTERM)."""
        if self.pid:
            signal_quietly(self.pid, signal.SIGKILL)
            signal_quietly(self.pid, signal.SIGKILL, group=True)
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = 0
        for name in list(self.fds):
            self._drop(name)
        self.sel.close()

    def _outcome(self, wait_status: int, duration: float) -> Outcome:
        result = Outcome(
            status="ok",
            stdout=bytes(self.bufs["stdout"]),
            stderr=bytes(self.bufs["stderr"]),
            stdout_truncated=self.truncated["stdout"],
            stderr_truncated=self.truncated["stderr"],
            duration_s=round(duration, 6),
        )
        if os.WIFSIGNALED(wait_status):
            result.signal = os.WTERMSIG(wait_status)
        else:
            result.exit_code = os.waitstatus_to_exitcode(wait_status)
        if self.setup_error:
            result.status, result.error = "infra_error", self.setup_error.decode(errors="replace")
        elif self.reason in ("timeout", "output_limit"):
            result.status = self.reason
        elif result.signal is not None:
            result.status = "killed"
        elif result.exit_code != 0:
            result.status = "nonzero_exit"
        return result
