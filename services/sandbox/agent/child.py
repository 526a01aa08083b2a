"""A run's process: a spare that received its plan becomes the run here."""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C core (no stub): _reset_signals
import atexit
import builtins
import errno
import fcntl
import io
import marshal
import os
import signal
import sys
import types
from dataclasses import dataclass
from typing import Any, NoReturn

from .common import DEFAULT_PATH, SETUP_FAILED
from .libc import PR_SET_DUMPABLE, PR_SET_PDEATHSIG, prctl
from .limits import Limits, apply_limits


@dataclass(frozen=True, slots=True)
class ChildPlan:
    """What a run's process does with its descriptors: where, under what limits, what.

    It travels from the agent to a spare (see the zygote module) as a marshal-ed tuple,
    next to the run's pipes: stdin, stdout, stderr and the status pipe, in that order.
    Marshal, not JSON: it is C code, and in a fork every page of the zygote that Python
    code touches (a reference count written) is copied, a few microseconds each.
    """

    workdir: str
    env: dict[str, str]
    limits: Limits
    code: str | None
    argv: tuple[str, ...] | None
    agent_pid: int

    def encode(self) -> bytes:
        limits = tuple(getattr(self.limits, name) for name in Limits.__slots__)
        return marshal.dumps((self.workdir, self.env, limits, self.code, self.argv, self.agent_pid))

    @classmethod
    def decode(cls, body: bytes) -> ChildPlan:
        workdir, env, limits, code, argv, agent_pid = marshal.loads(body)
        return cls(workdir, env, Limits(*limits), code, argv, agent_pid)


def _wire_fds(fds: list[int], inherited: tuple[Any, ...]) -> None:
    """The run's pipes onto 0-3 (the status pipe close-on-exec), nothing else open."""
    for obj in inherited:  # our socket objects: close them while their fds are still theirs
        try:
            obj.close()
        except OSError:
            pass
    # Lift them clear of 0-3 first: a received fd may sit where another one must go.
    lifted = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds]
    for target, fd in enumerate(lifted):
        os.dup2(fd, target, inheritable=target < 3)
    os.closerange(4, max(os.sysconf("SC_OPEN_MAX"), 1024))


def _reset_signals(python: bool) -> None:
    # Through _signal: signal.signal makes an enum of every old handler, Python code whose
    # pages a forked run would copy (a sixth of a trivial run's page faults).
    default = _signal.SIG_DFL
    for sig in (_signal.SIGTERM, _signal.SIGHUP, _signal.SIGCHLD):
        _signal.signal(sig, default)
    _signal.signal(_signal.SIGINT, _signal.default_int_handler if python else default)
    if not python:  # python ignores these itself; a real binary must start with defaults
        _signal.signal(_signal.SIGPIPE, default)
        _signal.signal(_signal.SIGXFSZ, default)


def _die_with_agent(plan: ChildPlan) -> None:
    """SIGKILL this child when the agent dies (an agent SIGKILL-ed on the host)."""
    if not prctl(PR_SET_PDEATHSIG, signal.SIGKILL):
        return
    if os.getppid() != plan.agent_pid:  # the agent died before prctl took effect
        os._exit(SETUP_FAILED)


def _enter(plan: ChildPlan, kit: RunKit) -> None:
    _die_with_agent(plan)
    # Spares are not dumpable (see the zygote); a run is, as usual: it holds only its own plan.
    prctl(PR_SET_DUMPABLE, 1)
    os.chdir(plan.workdir)
    if plan.env != kit.environ:  # usually equal: a dict compare is C, os.environ is not
        _set_environ(plan.env)
    apply_limits(plan.limits)


def run_environment(workdir: str) -> dict[str, str]:
    """A run's environment before the request's own variables: also the agent's (and so
    the zygote's), so that a run asking for nothing more has nothing to change."""
    return {"PATH": DEFAULT_PATH, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}


def _set_environ(env: dict[str, str]) -> None:
    """os.environ (and the C environment under it) becomes ``env``, changing only what
    differs."""
    environ = os.environ
    for key in [key for key in environ if key not in env]:
        del environ[key]
    for key, value in env.items():
        if environ.get(key) != value:
            environ[key] = value


def _text_stream(fd: int, write: bool, errors: str) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w" if write else "r", closefd=False)
    buffered = io.BufferedWriter(raw) if write else io.BufferedReader(raw)
    line_buffering = fd == 2  # as python3 does for a non-interactive stderr
    return io.TextIOWrapper(
        buffered, encoding="utf-8", errors=errors, newline="\n", line_buffering=line_buffering
    )


def _stdio_for_runs() -> dict[str, io.TextIOWrapper]:
    """sys.std* for Python runs, made on fds 0/1/2 while a pipe stands in for them: the
    streams a fresh python3 makes on a run's pipes (unseekable, no tty)."""
    read_end, write_end = (_dup_high(fd, close=True) for fd in os.pipe())
    saved: dict[int, int | None] = {}
    try:
        for fd, end in ((0, read_end), (1, write_end), (2, write_end)):
            try:
                saved[fd] = _dup_high(fd)
            except OSError:  # closed
                saved[fd] = None
            os.dup2(end, fd)
        return {
            "stdin": _text_stream(0, False, "surrogateescape"),
            "stdout": _text_stream(1, True, "surrogateescape"),
            "stderr": _text_stream(2, True, "backslashreplace"),
        }
    finally:
        for fd, copy in saved.items():
            if copy is None:
                os.close(fd)
            else:
                os.dup2(copy, fd)
                os.close(copy)
        os.close(read_end)
        os.close(write_end)


def _dup_high(fd: int, close: bool = False) -> int:
    """A close-on-exec copy of fd above 0-2 (which may be closed, and so handed out)."""
    copy = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    if close:
        os.close(fd)
    return copy


@dataclass(frozen=True, slots=True)
class RunKit:
    """What the zygote makes once for every run: a run (a fork) copies each page of the
    zygote that its Python code touches, a few microseconds each, so the less a run
    builds itself the sooner it is done.
    """

    #: The zygote's environment: a run whose plan asks for the same changes nothing.
    environ: dict[str, str]
    #: sys.std* for Python runs; fresh in each run, as the zygote never uses them.
    stdio: dict[str, io.TextIOWrapper]
    #: The zygote's own sys.std*: still referenced once a run replaced them, so that the
    #: run does not finalize them.
    replaced: tuple[Any, ...]

    @classmethod
    def make(cls) -> RunKit:
        own = (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__)
        return cls(dict(os.environ), _stdio_for_runs(), own)

    def use_stdio(self) -> None:
        for name, stream in self.stdio.items():
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish_interpreter() -> None:
    """What a normal interpreter exit does: join threads, atexit handlers, flush stdio."""
    threading = sys.modules.get("threading")
    shutdown = getattr(threading, "_shutdown", None)
    for step in (shutdown, getattr(atexit, "_run_exitfuncs", None)):
        if step is not None:
            try:
                step()
            except BaseException:  # nothing left to report it to
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def run_python(code: str, kit: RunKit) -> int:
    """Run code as ``python3 -c`` would in this (forked) interpreter; the exit status."""
    kit.use_stdio()
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    sys.path[0] = ""
    status = 0
    try:
        exec(compile(code, "<sandbox>", "exec"), main.__dict__)
    except SystemExit as exc:
        status = _exit_code(exc)
    except BaseException as exc:
        tb = exc.__traceback__
        tb = tb.tb_next if tb is not None else None  # hide this frame, as python3 -c would
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        status = 1
    _finish_interpreter()
    return status


def run_child(body: bytes, fds: list[int], inherited: tuple[Any, ...], kit: RunKit) -> NoReturn:
    """A spare becoming a run: set up, then run Python in place or exec the binary."""
    status_fd = fds[3]
    try:
        plan = ChildPlan.decode(body)
        python = plan.code is not None
        _reset_signals(python)
        os.setsid()
        _wire_fds(fds, inherited)
        status_fd = 3
        _enter(plan, kit)
    except BaseException as exc:
        _report_setup_failure(status_fd, exc)
    if plan.code is not None:
        os.close(3)
        os._exit(run_python(plan.code, kit))
    assert plan.argv is not None
    try:
        os.execvpe(plan.argv[0], list(plan.argv), plan.env)
    except OSError as exc:
        os.write(2, f"agent: cannot execute {plan.argv[0]!r}: {exc.strerror}\n".encode())
        os._exit(127 if exc.errno == errno.ENOENT else 126)


def _report_setup_failure(status_fd: int, exc: BaseException) -> NoReturn:
    try:
        os.write(status_fd, f"child setup failed: {type(exc).__name__}: {exc}".encode())
    finally:
        os._exit(SETUP_FAILED)
