"""The agent's server: the socket, the request loop, reset."""

from __future__ import annotations

import base64
import errno
import os
import selectors
import shutil
import signal
import socket
import stat
import struct
import traceback
import types
from typing import Any

from .child import ChildPlan, run_environment
from .common import CODE_DIR, DEFAULT_PATH, IO_TIMEOUT_S, BadRequest, FrameTooLarge, log
from .execution import Cancelled, Execution
from .files import (
    archive_workdir,
    empty_dir,
    extract_workdir,
    read_outputs,
    remove_scratch,
    reopen_workdir,
    wipe_container_scratch,
    write_files,
)
from .libc import load_libc
from .options import Options
from .processes import SchedState, helper_sched, kill_strays, open_pipes, reap_children, sched_state
from .protocol import (
    VERSION,
    ExecSpec,
    Outcome,
    b64_field,
    encode_outcome,
    parse_exec,
    recv_frame,
    send_frame,
)
from .zygote import SPARES, Zygote

PEERCRED = struct.Struct("3i")


class Agent:
    """Accepts connections and answers requests, one at a time."""

    def __init__(self, opts: Options, zygote: Zygote):
        self.opts = opts
        self.zygote = zygote
        self.listener: socket.socket | None = None
        self.sel = selectors.DefaultSelector()
        self.conns: set[socket.socket] = set()
        self.code_counter = 0
        self.sched_baseline = sched_state(os.getpid())
        #: The zygote's and spares': the agent's, at their nice value.
        self.helper_baseline = helper_sched(self.sched_baseline, opts.run_nice)
        # SIGCHLD writes a byte here (see watch_children): orphans are reaped at once.
        self.wake_fd, self._wake_w = os.pipe()
        for fd in (self.wake_fd, self._wake_w):
            os.set_blocking(fd, False)
        self.sel.register(self.wake_fd, selectors.EVENT_READ, "wake")

    # -- lifecycle

    def listen(self) -> None:
        os.makedirs(os.path.dirname(self.opts.socket_path), mode=0o700, exist_ok=True)
        os.makedirs(self.opts.workdir, mode=0o700, exist_ok=True)
        tmp = f"{self.opts.socket_path}.{os.getpid()}.tmp"
        self._unlink_socket(tmp)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(tmp)
        finally:
            os.umask(old)
        os.chmod(tmp, self.opts.socket_mode)
        sock.listen(16)
        self._unlink_socket(self.opts.socket_path)
        os.replace(tmp, self.opts.socket_path)
        self.listener = sock
        self.sel.register(sock, selectors.EVENT_READ, None)

    @staticmethod
    def _unlink_socket(path: str) -> None:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise SystemExit(f"agent: {path} exists and is not a socket")
        os.unlink(path)

    def watch_children(self) -> None:
        """Wake on SIGCHLD: as PID 1 (or a subreaper) the agent reaps every orphan."""
        signal.signal(signal.SIGCHLD, _ignore_signal)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

    def on_wake(self, keep: int = 0) -> None:
        """A signal came: drain the wake-up pipe, reap what exited (never ``keep``)."""
        try:
            while os.read(self.wake_fd, 4096):
                pass
        except BlockingIOError:
            pass
        self.reap(keep)

    def reap(self, keep: int = 0) -> None:
        for pid in reap_children(keep):
            self.zygote.reaped(pid)

    def serve_forever(self) -> None:
        while True:
            for key, _ in self.sel.select(timeout=1.0):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.data == "wake":
                    self.on_wake()
                else:
                    ran = self._serve_request(key.fileobj)  # type: ignore[arg-type]
                    # Spares are forked now: after the reply went out (it does not wait
                    # for a fork), and well before the next run.  After a run with no
                    # reset behind it, only if none is left: a reset sent next would
                    # wait for the fork.
                    self.zygote.ask(1 if ran else SPARES)
            self.reap()

    def close(self) -> None:
        self.zygote.stop()
        for conn in list(self.conns):
            self._drop_conn(conn)
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            try:
                os.unlink(self.opts.socket_path)
            except OSError:  # gone, or its directory was taken back by the host
                pass
        self.sel.close()

    # -- connections

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        if self.opts.container and self._peer_pid(conn) != 0:
            self._refuse_inside_peer(conn)
            return
        conn.settimeout(IO_TIMEOUT_S)
        self.conns.add(conn)
        self.sel.register(conn, selectors.EVENT_READ, None)

    @staticmethod
    def _peer_pid(conn: socket.socket) -> int:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
        return int(PEERCRED.unpack(raw)[0])

    @staticmethod
    def _refuse_inside_peer(conn: socket.socket) -> None:
        try:
            conn.settimeout(1.0)
            send_frame(conn, {"ok": False, "error": "peer inside the sandbox: refused"})
        except OSError:
            pass
        conn.close()

    def _drop_conn(self, conn: socket.socket) -> None:
        if conn in self.conns:
            self.conns.discard(conn)
            self.sel.unregister(conn)
        conn.close()

    def _serve_request(self, conn: socket.socket) -> bool:
        """Answer one request (and the reset an exec asked for); whether it was a run
        not followed by a reset."""
        keep, ran, reset_after = True, False, False
        try:
            req = recv_frame(conn)
            if req is None:
                keep = False
            else:
                ran = req.get("op") == "exec"
                reset_after = ran and req.get("reset_after") is True
                send_frame(conn, self.handle(conn, req))
        except FrameTooLarge as exc:
            self._reply_error(conn, str(exc))
            keep = False  # the oversized body is still in the stream
        except BadRequest as exc:
            keep = self._reply_error(conn, str(exc))
        except Cancelled:
            keep = False
        except OSError:  # the peer went away, or a read/send timed out
            keep = False
        except Exception as exc:  # a bug: answer it and keep serving
            keep = self._reply_error(conn, _internal_error(exc))
        if keep and reset_after:
            keep = self._send_reset(conn)
        if not keep:
            self._drop_conn(conn)
        return ran and not reset_after

    def _send_reset(self, conn: socket.socket) -> bool:
        """Reset now and send its answer; whether the connection still stands."""
        try:
            reply = self.reset()
        except Exception as exc:  # a bug: a failed reset, and the host recycles the sandbox
            reply = {"ok": False, "error": _internal_error(exc)}
        try:
            send_frame(conn, reply)
        except OSError:
            return False
        return True

    @staticmethod
    def _reply_error(conn: socket.socket, error: str) -> bool:
        try:
            send_frame(conn, {"ok": False, "error": error})
        except OSError:
            return False
        return True

    # -- requests

    def handle(self, conn: socket.socket, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "ping":
            return self.ping()
        if op == "exec":
            return self.exec(conn, parse_exec(req, self.opts))
        if op == "reset":
            return self.reset()
        if op == "archive":
            data = archive_workdir(self.opts.workdir)
            return {"ok": True, "data_b64": base64.b64encode(data).decode(), "size": len(data)}
        if op == "extract":
            count = extract_workdir(self.opts.workdir, b64_field(req.get("data_b64"), "data_b64"))
            return {"ok": True, "files": count}
        raise BadRequest(f"unknown op {op!r}")

    def ping(self) -> dict[str, Any]:
        languages = sorted(self.opts.languages)
        return {"ok": True, "pid": os.getpid(), "version": VERSION, "languages": languages}

    def reset(self) -> dict[str, Any]:
        zygote = self.zygote
        zygote.settle()
        killed, clean = 0, True
        if self.opts.container:
            spared = zygote.pids() if zygote.trusted else frozenset()
            killed, clean = kill_strays(spared, zygote.reaped)
        self.reap()
        if not clean:
            return {"ok": False, "error": "reset: processes survived SIGKILL", "killed": killed}
        tampered = self._tampered() if self.opts.container else None
        if tampered is not None:
            return {"ok": False, "error": f"reset: {tampered}", "killed": killed}
        try:
            zygote.refresh()
            os.makedirs(self.opts.workdir, mode=0o700, exist_ok=True)  # code may have removed it
            empty_dir(self.opts.workdir)
            if self.opts.container:
                wipe_container_scratch(load_libc())
        except (OSError, RecursionError) as exc:
            return {"ok": False, "error": f"reset: cannot clean up after the task: {exc}"}
        return {"ok": True, "killed": killed}

    def _tampered(self) -> str | None:
        """Why the agent and its helpers are no longer fit to serve, if code made them so.

        Code shares their uid: it may renice them, change their scheduling policy or CPU
        affinity (a zygote's pass to every later run).  Nothing in this uid can undo a
        raised nice value, so the sandbox is recycled (the host reads a failed reset so).
        """
        expected: dict[int, SchedState | None]
        expected = dict.fromkeys(self.zygote.pids(), self.helper_baseline)
        expected[os.getpid()] = self.sched_baseline
        for pid, baseline in expected.items():
            state = sched_state(pid)
            if state is not None and state != baseline:
                return f"the scheduling of process {pid} was changed: {state}"
        return None

    def exec(self, conn: socket.socket, spec: ExecSpec) -> dict[str, Any]:
        code_file: str | None = None
        try:
            reopen_workdir(self.opts.workdir)
            write_files(self.opts.workdir, spec.files)
            argv, code_file = self._command(spec)
            outcome = self._execute(conn, spec, argv)
        except (BadRequest, Cancelled):
            raise
        except OSError as exc:
            outcome = Outcome("infra_error", error=f"{type(exc).__name__}: {exc}")
        else:
            outcome.outputs = read_outputs(self.opts.workdir, spec.outputs, spec.output_bytes)
        finally:
            if code_file is not None:
                remove_scratch(os.path.dirname(code_file))
            self.reap()
        return encode_outcome(spec.id, outcome)

    def _command(self, spec: ExecSpec) -> tuple[tuple[str, ...] | None, str | None]:
        """argv to exec (None: Python runs in the spare) and the code file to remove afterwards."""
        if spec.argv is not None:
            return spec.argv, None
        language = spec.language
        assert language is not None and spec.code is not None
        if language.argv is None:
            return None, None
        program = language.needs or language.argv[0]
        if shutil.which(program, path=spec.env.get("PATH", DEFAULT_PATH)) is None:
            raise OSError(errno.ENOENT, f"{language.name}: {program} not installed", program)
        self.code_counter += 1
        rel = os.path.join(CODE_DIR, f"code-{self.code_counter}{language.suffix}")
        write_files(self.opts.workdir, {rel: spec.code.encode()})
        path = os.path.join(self.opts.workdir, rel)
        subst = {"file": path, "workdir": self.opts.workdir}
        return tuple(part.format_map(subst) for part in language.argv), path

    def _execute(
        self, conn: socket.socket, spec: ExecSpec, argv: tuple[str, ...] | None
    ) -> Outcome:
        (stdin_r, stdin_w), (out_r, out_w), (err_r, err_w), (status_r, status_w) = open_pipes(4)
        plan = ChildPlan(
            workdir=self.opts.workdir,
            env=self._child_env(spec),
            limits=spec.limits,
            code=spec.code if argv is None else None,
            argv=argv,
            agent_pid=os.getpid(),
        )
        ends = {"stdin": stdin_w, "stdout": out_r, "stderr": err_r, "status": status_r}
        child_ends = [stdin_r, out_w, err_w, status_w]  # in RUN_PIPES order
        return Execution(self, plan, spec, conn).run(ends, child_ends)

    def _child_env(self, spec: ExecSpec) -> dict[str, str]:
        env = run_environment(self.opts.workdir)
        env.update(spec.env)
        return env


def _internal_error(exc: Exception) -> str:
    """Log a bug with its traceback; the error to answer with."""
    log(f"internal error: {''.join(traceback.format_exception(exc))}")
    return f"agent internal error: {exc!r}"


def _ignore_signal(_signum: int, _frame: types.FrameType | None) -> None:
    """SIGCHLD's handler: its only job is the byte the wake-up fd gets."""
