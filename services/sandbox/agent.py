"""Temper sandbox agent: runs executions for the host over a unix socket.

A single-file, standard-library-only Python 3.11 program.  It is the command of every
sandbox container, and its PID 1 (no ``--init``: an init of the code's uid could be
traced by code and would outlive every reset; non-root, no capabilities, read-only
root, tmpfs workdir), and is also run by the local backend, under bubblewrap (PID 1
again) or directly on the host.  It assumes a container only when given
``--container``.  As an init it reaps every orphan as soon as it exits (SIGCHLD) and
takes SIGTERM/SIGINT as the order to stop; code cannot SIGKILL or SIGSTOP it (the
kernel drops those when sent to a PID namespace's init from inside).

    python3 agent.py --socket PATH --workdir DIR [--container] [--languages JSON]
                     [--nofile N] [--fsize-bytes N] [--memory-bytes N | --memory-mb N]
                     [--nproc N]
                     [--socket-mode OCTAL] [--run-nice 0-19]

It serves until SIGTERM (or SIGINT), then kills what it started and removes its socket.

Socket
------
The socket is bound under a temporary name with umask 0177 (mode 0600 from the start),
chmod-ed to ``--socket-mode`` and renamed onto PATH once listening, so PATH appearing
means "ready".  The default mode is 0600 on the host (the host user is the agent's
user) and 0666 with ``--container``: there the agent runs as uid 10001 while the host
connects as its own uid, so access is controlled by the host directory that is
bind-mounted at the socket's directory (the pool keeps it in a private 0700 parent).
With ``--container`` a peer that is visible in the agent's PID namespace (SO_PEERCRED
pid != 0), i.e. sandboxed code itself, is answered ``ok:false`` and disconnected: only
processes outside the container (the host) may drive the agent.
Nothing else is written outside the workdir (the socket's directory is created 0700 if
it is missing).

Wire protocol (host <-> agent; internal, not part of the NATS protocol)
-----------------------------------------------------------------------
Each frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON
holding one object; frames are capped at 64 MiB.  A connection carries any number of
request/response pairs in sequence (one reply per request, in order).  The agent
serves one request at a time; it keeps several connections open and answers whichever
sends a request.

    {"op": "ping"}
      -> {"ok": true, "pid": N, "version": 1, "languages": ["bash", "python", "sh"]}

    {"op": "exec", "id": str, "language": str | null, "code": str | null,
     "argv": [str] | null, "stdin_b64": str, "files": {relpath: b64},
     "timeout_s": float, "output_bytes": int, "env": {str: str},
     "limits": {"memory_bytes": int|null, "nproc": int|null, "nofile": int|null,
                "fsize_bytes": int|null} | null}
      -> {"id": str, "status": "ok" | "nonzero_exit" | "timeout" | "output_limit"
                               | "killed" | "infra_error",
          "exit_code": int | null, "signal": int | null,
          "stdout_b64": str, "stderr_b64": str,
          "stdout_truncated": bool, "stderr_truncated": bool,
          "duration_s": float, "error": str | null}

      Exactly one of ``code`` and ``argv``.  ``language`` defaults to "python" for
      code and is ignored for argv.  ``files`` are written under the workdir first.
      Optional with defaults: stdin_b64 "", files {}, env {}, timeout_s 10,
      output_bytes 1 MiB (at most 16 MiB), limits null (the agent's options).
      ``limits`` override the agent's options for this exec; ``nproc`` is refused
      with ``--container`` (RLIMIT_NPROC counts per uid across the whole host).
      Statuses: ok / nonzero_exit (the main process exited 0 / N); timeout (wall clock
      expired, everything killed); output_limit (stdout or stderr passed
      output_bytes: everything killed, that stream cut at exactly output_bytes);
      killed (ended by a signal the agent did not send: ``signal`` says which, e.g. 9
      for the OOM killer); infra_error (the agent could not run it: fork failed,
      interpreter missing, workdir unwritable...; ``error`` says why).
      ``exit_code``/``signal`` always report the main process's wait status.
      With ``"reset_after": true`` the agent resets as soon as the reply is sent, and
      sends the reset's answer as the next frame (as if ``{"op": "reset"}`` had
      followed): a one-off exec's sandbox is clean without another round trip.  That
      answer follows any reply to the exec, an error too.

    {"op": "archive"} -> {"ok": true, "data_b64": str, "size": N}
      The workdir as a gzip tar (regular files and directories only; links, devices
      and FIFOs are left out; at most MAX_ARCHIVE_BYTES): a session snapshot.

    {"op": "extract", "data_b64": str} -> {"ok": true, "files": N}
      Empty the workdir, then unpack an archive made by ``archive`` into it; members
      that are not regular files or directories, or whose path leaves the workdir,
      make the request fail (``ok: false``) before anything is written.

    {"op": "reset"} -> {"ok": true, "killed": N}
      Kills every process the executions left behind and empties the workdir (files,
      directories, dotfiles; not the workdir itself).  With ``--container``: every
      process but PID 1, the agent and its zygote and spares (a /proc scan inside the
      container's PID namespace); the container's other writable places (/tmp, /dev/shm,
      /dev/mqueue) are emptied too and its SysV IPC objects removed, so nothing one
      task leaves there reaches the next.  Without: nothing outside the agent's own
      process groups is touched (and each exec's group is already killed when the
      exec ends), so only the workdir is emptied; a process that left its group with
      setsid() survives on the host (the local backend's weak-isolation mode).
      A zygote that was lost (killed by code) and exec-ed afresh meanwhile is replaced
      here, once no process of the task is left.

    Bad requests (bad JSON, not an object, unknown op, invalid fields, an absolute or
    ``..`` file path, unknown language, both or neither of code/argv, a frame over the
    cap) are answered ``{"ok": false, "error": "..."}`` and the connection stays usable,
    except after an oversized frame, where the agent answers and then closes it.  A
    failed reset is also ``ok: false`` (the host should recycle the sandbox).
    Closing the connection while an exec runs cancels it: it is killed as on a timeout
    and no reply is sent.

Execution
---------
Each exec is a child in its own session and process group, cwd = workdir, with a clean
environment (PATH, HOME=workdir, TMPDIR=workdir, LANG=C.UTF-8, then the request's env),
stdin fed from the request, RLIMIT_CORE 0, RLIMIT_NOFILE and RLIMIT_FSIZE always,
RLIMIT_AS and RLIMIT_NPROC when configured, no file descriptor but 0, 1, 2, and
PR_SET_PDEATHSIG=SIGKILL (an agent that dies takes its running child with it), at nice
value --run-nice (by default 19 with --container, where the agent then preempts it at
once, and 0 without).
No run is a fork of the agent, whose heap still holds earlier requests: each is a
"spare" forked ahead of time from the agent's zygote, a process forked before the
agent read any request (see "the zygote" below), and handed its plan and pipes over a
socket pair.  Code runs as the agent's uid, so the agent, the zygote and idle spares
are non-dumpable (code cannot ptrace them, nor read or write their memory,
descriptors or environment through /proc; a run is dumpable again, as a normal
process), and a seccomp filter of the agent's refuses every process it starts
ptrace, process_vm_readv/writev, pidfd_getfd and prlimit64 on another process.
Python code runs in the spare itself (interpreter already loaded; behaves as
``python3 -c``: __main__, atexit, non-daemon threads joined, traceback + exit 1 on an
uncaught exception); spares keep the zygote's hash seed, so set iteration order
repeats across executions.  Other languages exec a real binary with the code in a file
under ``<workdir>/.temper/``, removed afterwards.  The language table maps a
name to "python-fork", an argv template (``{file}`` = the code file, ``{workdir}``) or
``{"argv": [...], "suffix": ".c", "needs": "gcc"}`` (``needs``: the program that must be
installed, else the run is an infra_error; default argv[0]); ``--languages`` JSON
entries are merged over the defaults (null removes one).  The defaults: python, bash,
sh and c (gcc: built in the code's directory, then run; that directory goes afterwards).
Request files never pass through a symlink and only replace regular files (anything
else is a bad request).

When the main process exits, its process group is killed: at once if the pipes are
closed, else after a 50 ms grace (a background child holding stdout open cannot hang
the exec).  The leader is reaped only after that kill, so the group id cannot have been
reused.  With ``--container``, a timeout, an output limit, a cancellation or an expired
grace also kills every other process but PID 1, the agent, its zygote and spares
(children that setsid() away); a process that left the group quietly survives until
``reset``.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C core (no stub): _reset_signals
import argparse
import atexit
import base64
import builtins
import errno
import fcntl
import functools
import gc
import io
import json
import marshal
import os
import resource
import selectors
import shutil
import signal
import socket
import stat
import struct
import sys
import tarfile
import time
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, NoReturn

VERSION = 1
MAX_FRAME = 64 * 1024 * 1024
MAX_OUTPUT_BYTES = 16 * 1024 * 1024
MAX_TIMEOUT_S = 24 * 3600.0
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_OUTPUT_BYTES = 1024 * 1024
DEFAULT_NOFILE = 256
DEFAULT_FSIZE_BYTES = 256 * 1024 * 1024
#: After the main process exits, how long its descendants may keep the pipes open.
PIPE_GRACE_S = 0.05
#: How long a frame may take to arrive once its first byte did, and a reply to be sent.
IO_TIMEOUT_S = 30.0
#: How long a reset waits for killed processes to disappear.
KILL_WAIT_S = 2.0
READ_CHUNK = 65536
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PYTHON_FORK = "python-fork"
CODE_DIR = ".temper"
#: A snapshot must fit in one frame once base64-encoded.
MAX_ARCHIVE_BYTES = 40 * 1024 * 1024
DEFAULT_LANGUAGES: dict[str, Any] = {
    "python": PYTHON_FORK,
    "bash": {"argv": ["bash", "{file}"], "suffix": ".sh"},
    "sh": {"argv": ["sh", "{file}"], "suffix": ".sh"},
    # Built next to the code file (the agent's scratch directory, emptied after the run).
    "c": {
        "argv": ["sh", "-c", 'gcc -O2 -o "$1.bin" "$1" -lm && exec "$1.bin"', "c", "{file}"],
        "suffix": ".c",
        "needs": "gcc",
    },
}
HEADER = struct.Struct(">I")
PEERCRED = struct.Struct("3i")
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
IPC_RMID = 0
#: Writable places of a sandbox container besides the workdir, emptied by reset.
CONTAINER_SCRATCH = ("/tmp", "/dev/shm", "/dev/mqueue")
#: The exit status of a child whose setup failed (its reason goes up the status pipe).
SETUP_FAILED = 126
#: A run's pipes, as a spare receives them (and wires them onto fds 0-3).
RUN_PIPES = ("stdin", "stdout", "stderr", "status")
MAX_PLAN_CHUNK = 1 << 20


class BadRequest(Exception):
    """The request is malformed: answered ``{"ok": false, "error": ...}``."""


class FrameTooLarge(BadRequest):
    """A frame over MAX_FRAME: answered, then the connection is closed."""


class Terminated(BaseException):
    """SIGTERM/SIGINT: unwinds the agent (a BaseException so no handler swallows it)."""


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True, slots=True)
class Language:
    name: str
    #: None for the python fork fast path, else the argv template.
    argv: tuple[str, ...] | None
    suffix: str = ""
    #: The program that must be installed (default: argv[0]); else an infra_error.
    needs: str | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    nofile: int
    fsize_bytes: int
    memory_bytes: int | None = None
    nproc: int | None = None


@dataclass(frozen=True, slots=True)
class Options:
    socket_path: str
    workdir: str
    container: bool
    languages: dict[str, Language]
    limits: Limits
    socket_mode: int
    #: Nice value of the zygote, and so of spares and runs (see "the zygote").
    run_nice: int


def parse_language(name: str, entry: Any) -> Language:
    if entry == PYTHON_FORK:
        return Language(name, None)
    if isinstance(entry, list):
        entry = {"argv": entry}
    if not isinstance(entry, dict):
        raise ValueError(f"language {name!r}: expected {PYTHON_FORK!r}, a list or an object")
    argv, suffix, needs = entry.get("argv"), entry.get("suffix", ""), entry.get("needs")
    if not _is_str_list(argv) or not argv or not isinstance(suffix, str):
        raise ValueError(f"language {name!r}: argv must be a non-empty list of strings")
    if needs is not None and not isinstance(needs, str):
        raise ValueError(f"language {name!r}: needs must be a program name")
    return Language(name, tuple(argv), suffix, needs)


def parse_languages(override_json: str | None) -> dict[str, Language]:
    table = dict(DEFAULT_LANGUAGES)
    if override_json:
        override = json.loads(override_json)
        if not isinstance(override, dict):
            raise ValueError("--languages must be a JSON object")
        table.update(override)
    return {name: parse_language(name, e) for name, e in table.items() if e is not None}


def parse_options(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(description="Temper sandbox agent")
    p.add_argument("--socket", required=True, help="unix socket path to listen on")
    p.add_argument("--workdir", required=True, help="working directory of executions")
    p.add_argument("--container", action="store_true", help="own the PID namespace")
    p.add_argument("--languages", help="JSON object merged over the language table")
    p.add_argument("--nofile", type=int, default=DEFAULT_NOFILE)
    p.add_argument("--fsize-bytes", type=int, default=DEFAULT_FSIZE_BYTES)
    memory = p.add_mutually_exclusive_group()
    memory.add_argument("--memory-bytes", type=int, help="RLIMIT_AS of each execution")
    memory.add_argument("--memory-mb", type=int, help="the same in MiB")
    p.add_argument("--nproc", type=int, help="RLIMIT_NPROC (refused with --container)")
    p.add_argument("--socket-mode", type=lambda s: int(s, 8), help="octal, e.g. 600")
    p.add_argument(
        "--run-nice",
        type=int,
        choices=range(20),
        metavar="0-19",
        help="nice value of runs: 19 with --container (the default), 0 without",
    )
    a = p.parse_args(argv)
    if a.container and a.nproc is not None:
        p.error("--nproc is per uid across the whole host: not with --container")
    try:
        languages = parse_languages(a.languages)
    except ValueError as exc:
        p.error(str(exc))
    socket_dir = os.path.dirname(os.path.abspath(a.socket))
    workdir = os.path.abspath(a.workdir)
    if os.path.commonpath([socket_dir, workdir]) == workdir:
        p.error("the socket must not live inside the workdir (reset empties it)")
    mode = a.socket_mode if a.socket_mode is not None else (0o666 if a.container else 0o600)
    memory_bytes = a.memory_mb * 1024 * 1024 if a.memory_mb is not None else a.memory_bytes
    limits = Limits(a.nofile, a.fsize_bytes, memory_bytes, a.nproc)
    run_nice = a.run_nice if a.run_nice is not None else (19 if a.container else 0)
    socket_path = os.path.abspath(a.socket)
    return Options(socket_path, workdir, a.container, languages, limits, mode, run_nice)


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class ExecSpec:
    id: str
    language: Language | None
    code: str | None
    argv: tuple[str, ...] | None
    stdin: bytes
    files: dict[str, bytes]
    timeout_s: float
    output_bytes: int
    env: dict[str, str]
    limits: Limits


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _get(req: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = req.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BadRequest(f"{key}: wrong type {type(value).__name__}")
    return value


def _b64(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise BadRequest(f"{where}: expected a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise BadRequest(f"{where}: invalid base64") from exc


def check_relpath(rel: Any) -> str:
    """A file path from a request: relative, normalised, never leaving the workdir."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise BadRequest(f"files: invalid path {rel!r}")
    if os.path.isabs(rel):
        raise BadRequest(f"files: absolute path {rel!r}")
    parts = rel.split("/")
    if ".." in parts:
        raise BadRequest(f"files: path {rel!r} leaves the workdir")
    norm = os.path.normpath(rel)
    if norm == ".":
        raise BadRequest(f"files: path {rel!r} names the workdir")
    return norm


def parse_env(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise BadRequest("env: expected an object of strings")
    for key, value in raw.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise BadRequest(f"env: invalid variable {key!r}")
    return dict(raw)


def parse_limits(raw: Any, base: Limits, container: bool) -> Limits:
    if raw is None:
        return base
    if not isinstance(raw, dict):
        raise BadRequest("limits: expected an object")
    values: dict[str, int] = {}
    for key in ("memory_bytes", "nproc", "nofile", "fsize_bytes"):
        value = _get(raw, key, int, None)
        if value is not None:
            if value <= 0:
                raise BadRequest(f"limits.{key}: must be positive")
            values[key] = value
    if container and "nproc" in values:
        raise BadRequest("limits.nproc: not in a container (RLIMIT_NPROC is per uid host-wide)")
    return replace(base, **values)


def parse_exec(req: dict[str, Any], opts: Options) -> ExecSpec:
    exec_id = req.get("id")
    if not isinstance(exec_id, str):
        raise BadRequest("id: expected a string")
    code, argv = req.get("code"), req.get("argv")
    if (code is None) == (argv is None):
        raise BadRequest("exactly one of code and argv must be set")
    language = None
    if code is not None:
        if not isinstance(code, str):
            raise BadRequest("code: expected a string")
        name = _get(req, "language", str, "python")
        language = opts.languages.get(name)
        if language is None:
            raise BadRequest(f"unknown language {name!r}; known: {sorted(opts.languages)}")
    elif not _is_str_list(argv) or not argv or any("\0" in a for a in argv):
        raise BadRequest("argv: expected a non-empty list of strings")
    files_raw = _get(req, "files", dict, {})
    files = {check_relpath(k): _b64(v, f"files[{k!r}]") for k, v in files_raw.items()}
    timeout_s = float(_get(req, "timeout_s", (int, float), DEFAULT_TIMEOUT_S))
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise BadRequest(f"timeout_s: must be in (0, {MAX_TIMEOUT_S}]")
    output_bytes = _get(req, "output_bytes", int, DEFAULT_OUTPUT_BYTES)
    if not 0 < output_bytes <= MAX_OUTPUT_BYTES:
        raise BadRequest(f"output_bytes: must be in [1, {MAX_OUTPUT_BYTES}]")
    return ExecSpec(
        id=exec_id,
        language=language,
        code=code,
        argv=tuple(argv) if argv is not None else None,
        stdin=_b64(req.get("stdin_b64") or "", "stdin_b64"),
        files=files,
        timeout_s=timeout_s,
        output_bytes=output_bytes,
        env=parse_env(req.get("env")),
        limits=parse_limits(req.get("limits"), opts.limits, opts.container),
    )


# --------------------------------------------------------------------------- framing


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """n bytes, or None on a clean EOF before the first byte."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 20))
        if k == 0:
            if got == 0:
                return None
            raise ConnectionError("connection closed inside a frame")
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket) -> dict[str, Any] | None:
    """The next request, None on EOF; BadRequest for a frame that is not a JSON object."""
    header = recv_exact(sock, HEADER.size)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise FrameTooLarge(f"frame of {length} bytes is over the {MAX_FRAME} byte cap")
    body = recv_exact(sock, length) if length else b""
    if body is None:
        raise ConnectionError("connection closed inside a frame")
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"bad JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise BadRequest("a request must be a JSON object")
    return obj


def send_frame(sock: socket.socket, obj: dict[str, Any]) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(HEADER.pack(len(body)) + body)


# --------------------------------------------------------------------------- files


def _make_parents(root: str, rel: str) -> None:
    """Create the directories of rel under root, refusing to pass through a symlink."""
    current = root
    for part in os.path.dirname(rel).split(os.sep) if os.path.dirname(rel) else ():
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            if os.path.islink(current) or not os.path.isdir(current):
                raise BadRequest(f"files: {rel!r}: {part!r} is not a directory") from None


def write_files(workdir: str, files: dict[str, bytes]) -> None:
    """Write request files under workdir (rel paths from check_relpath); no symlink is followed."""
    for rel, data in files.items():
        _make_parents(workdir, rel)
        # O_NONBLOCK: a FIFO planted by earlier code fails (ENXIO) instead of blocking us.
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(os.path.join(workdir, rel), flags, 0o644)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise BadRequest(f"files: {rel!r} is not a regular file") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise BadRequest(f"files: {rel!r} is not a regular file")
            os.set_blocking(fd, True)
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def remove_tree(path: str) -> None:
    """Remove a directory tree, restoring permissions that code may have taken away."""
    os.chmod(path, 0o700)
    with os.scandir(path) as entries:
        items = list(entries)
    for entry in items:
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path)
        else:
            os.unlink(entry.path)
    os.rmdir(path)


def empty_dir(path: str, chmod: bool = True) -> None:
    """Remove what path holds; chmod=False for a directory we do not own (/dev/shm)."""
    if chmod:
        os.chmod(path, 0o700)
    with os.scandir(path) as entries:
        items = list(entries)
    for entry in items:
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path)
        else:
            os.unlink(entry.path)


# --------------------------------------------------------------------------- snapshots


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Keep regular files and directories only, owned by nobody in particular."""
    if not (info.isfile() or info.isdir()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode &= 0o755
    return info


def archive_workdir(workdir: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in sorted(os.listdir(workdir)):
            if name != CODE_DIR:
                tar.add(os.path.join(workdir, name), arcname=name, filter=_plain)
    if buffer.tell() > MAX_ARCHIVE_BYTES:
        raise BadRequest(f"archive: {buffer.tell()} bytes, over {MAX_ARCHIVE_BYTES}")
    return buffer.getvalue()


def extract_workdir(workdir: str, data: bytes) -> int:
    """Replace the workdir's content with an archive's; everything is checked first."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = [(m, check_relpath(m.name)) for m in tar.getmembers()]
            for member, rel in members:
                if not (member.isfile() or member.isdir()):
                    raise BadRequest(f"extract: {rel!r} is not a regular file or directory")
            files = {rel: _member_bytes(tar, m) for m, rel in members if m.isfile()}
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BadRequest(f"extract: not a snapshot archive ({exc})") from None
    empty_dir(workdir)
    for member, rel in members:
        if member.isdir():
            _make_parents(workdir, os.path.join(rel, "x"))
    write_files(workdir, files)
    return len(files)


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    return handle.read() if handle is not None else b""


def remove_sysv_ipc(libc: Any) -> None:
    """Remove every SysV IPC object (the container's IPC namespace is its own)."""
    if libc is None:
        return
    import ctypes

    for kind, ctl in (("shm", libc.shmctl), ("msg", libc.msgctl), ("sem", libc.semctl)):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                ids = [int(row.split()[1]) for row in f.read().splitlines()[1:] if row.strip()]
        except OSError:
            continue
        for ident in ids:
            args = (ident, 0, IPC_RMID) if kind == "sem" else (ident, IPC_RMID, None)
            if ctl(*args) != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.EIDRM):
                raise OSError(ctypes.get_errno(), f"cannot remove SysV {kind} {ident}")


def wipe_container_scratch(libc: Any) -> None:
    """Empty the container's writable places besides the workdir; drop SysV IPC objects."""
    for path in CONTAINER_SCRATCH:
        if os.path.isdir(path):
            empty_dir(path, chmod=False)
    remove_sysv_ipc(libc)


# --------------------------------------------------------------------------- processes


def _signal_quietly(pid: int, sig: int, group: bool = False) -> bool:
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
            if _signal_quietly(pid, signal.SIGKILL):
                killed.add(pid)
        for pid in reap_children():
            if on_reaped is not None:
                on_reaped(pid)
        if time.monotonic() > end:
            return len(killed), False
        time.sleep(0.001)


# --------------------------------------------------------------------------- hardening
#
# Code runs with the agent's uid, so the agent, the zygote and idle spares are made
# non-dumpable: the kernel then refuses code ptrace and /proc/<pid>/mem on them.  On
# top of that (and of Docker's profile: filters stack) the agent installs a seccomp
# filter of its own, inherited by every process it starts, that answers EPERM to the
# calls reaching into another process: ptrace, process_vm_readv/writev and
# pidfd_getfd, plus prlimit64 on another process (a lowered hard limit of the agent,
# zygote or a spare would outlive the task that set it).  x32 calls are refused
# whole (nothing here uses that ABI).

PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_EPERM = 0x00050000 | errno.EPERM
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_AARCH64 = 0xC00000B7
AUDIT_ARCH_ARM = 0x40000028
X32_SYSCALL_BIT = 0x40000000
#: Per audit arch: (ptrace, process_vm_readv, process_vm_writev, pidfd_getfd), prlimit64.
DENIED_SYSCALLS = {
    AUDIT_ARCH_X86_64: ((101, 310, 311, 438), 302),
    AUDIT_ARCH_I386: ((26, 347, 348, 438), 340),  # int 0x80 from a 64-bit process too
    AUDIT_ARCH_AARCH64: ((117, 270, 271, 438), 261),
    AUDIT_ARCH_ARM: ((26, 376, 377, 438), 369),
}
#: uname -m -> the audit arches its processes can make calls as (native, compat).
MACHINE_ARCHES = {
    "x86_64": (AUDIT_ARCH_X86_64, AUDIT_ARCH_I386),
    "aarch64": (AUDIT_ARCH_AARCH64, AUDIT_ARCH_ARM),
}
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
#: struct seccomp_data: the call's number, its arch, the low word of its first argument.
SECCOMP_NR, SECCOMP_ARCH, SECCOMP_ARG0_LOW = 0, 4, 16
BPF_INSN = struct.Struct("=HBBI")

#: One BPF instruction (code, k, jump-if-true label, jump-if-false label), or a label.
Insn = tuple[int, int, str | None, str | None] | str


def assemble_bpf(program: list[Insn]) -> bytes:
    """Classic BPF from instructions whose jumps name labels (forward only)."""
    position, offsets = 0, {}
    for item in program:
        if isinstance(item, str):
            offsets[item] = position
        else:
            position += 1
    out, position = bytearray(), 0
    for item in program:
        if isinstance(item, str):
            continue
        code, k, if_true, if_false = item
        jt = offsets[if_true] - position - 1 if if_true else 0
        jf = offsets[if_false] - position - 1 if if_false else 0
        out += BPF_INSN.pack(code, jt, jf, k)
        position += 1
    return bytes(out)


def seccomp_program(machine: str) -> bytes | None:
    """The filter for this machine's arches; None for a machine we have no table for."""
    arches = MACHINE_ARCHES.get(machine)
    if arches is None:
        return None
    program: list[Insn] = [(BPF_LD_W_ABS, SECCOMP_ARCH, None, None)]
    program += [(BPF_JEQ_K, arch, f"arch-{arch}", None) for arch in arches]
    program.append((BPF_RET_K, SECCOMP_RET_EPERM, None, None))  # any other arch
    for arch in arches:
        denied, prlimit64 = DENIED_SYSCALLS[arch]
        program += [f"arch-{arch}", (BPF_LD_W_ABS, SECCOMP_NR, None, None)]
        if arch == AUDIT_ARCH_X86_64:
            program.append((BPF_JGE_K, X32_SYSCALL_BIT, "deny", None))
        program += [(BPF_JEQ_K, nr, "deny", None) for nr in denied]
        program += [(BPF_JEQ_K, prlimit64, "prlimit64", "allow")]
    program += [
        "prlimit64",
        (BPF_LD_W_ABS, SECCOMP_ARG0_LOW, None, None),
        (BPF_JEQ_K, 0, "allow", "deny"),  # pid 0 is the caller itself
        "allow",
        (BPF_RET_K, SECCOMP_RET_ALLOW, None, None),
        "deny",
        (BPF_RET_K, SECCOMP_RET_EPERM, None, None),
    ]
    return assemble_bpf(program)


def install_seccomp_filter() -> str | None:
    """Install the filter above on this process (and so its descendants); None, or why not."""
    machine = os.uname().machine
    program = seccomp_program(machine)
    libc = load_libc()
    if program is None or libc is None:
        return f"no syscall table for {machine}" if libc else "no libc"
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    fprog = SockFprog(len(program) // BPF_INSN.size, program)
    # Without no_new_privs an unprivileged process may not install a filter; Docker and
    # bubblewrap set it already, the plain local backend gets it here.
    if not prctl(PR_SET_NO_NEW_PRIVS, 1) or not prctl(
        PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog)
    ):
        return os.strerror(ctypes.get_errno())
    return None


# --------------------------------------------------------------------------- the child


@dataclass(frozen=True, slots=True)
class ChildPlan:
    """What a run's process does with its descriptors: where, under what limits, what.

    It travels from the agent to a spare (see the zygote below) as a marshal-ed tuple,
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


def _set_limit(which: int, value: int) -> None:
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def apply_limits(limits: Limits) -> None:
    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_NOFILE, limits.nofile)
    _set_limit(resource.RLIMIT_FSIZE, limits.fsize_bytes)
    if limits.memory_bytes is not None:
        _set_limit(resource.RLIMIT_AS, limits.memory_bytes)
    if limits.nproc is not None:
        _set_limit(resource.RLIMIT_NPROC, limits.nproc)


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


@functools.cache
def load_libc() -> Any:
    """libc through ctypes (standard library, but optional in minimal builds); None without.

    Loaded once, by the agent before it forks the zygote, so no run pays for it.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None
    # Its arguments are unsigned longs: say so, or ctypes passes ints (and pointers) as C ints.
    libc.prctl.argtypes = (ctypes.c_int, *[ctypes.c_ulong] * 4)
    return libc


def prctl(option: int, value: int, arg3: int = 0) -> bool:
    """prctl(option, value, arg3, 0, 0); False where it failed or libc is not reachable."""
    libc = load_libc()
    return libc is not None and libc.prctl(option, value, arg3, 0, 0) == 0


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


# --------------------------------------------------------------------------- the zygote
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
SPARE_PID = struct.Struct("=i")
#: How long the agent waits for the zygote's answer (a fork or two; an exec-ed start-up).
SPARE_WAIT_S = 5.0
#: Spares kept ready: a run takes one and leaves another, so the reset that follows a
#: run never waits for a fork (it must know every helper before strays are killed).
SPARES = 2
#: Spares a run may try before it gives up: a stray may have killed the ready ones.
TAKE_TRIES = SPARES + 2
AGENT_FILE = os.path.abspath(__file__)


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


class MiddleFork:
    """A sibling by forking twice: the middle process exits, its child goes to the agent
    (PID 1, or a subreaper).  Costs a fork and an exit more than SiblingFork."""

    def __init__(self) -> None:
        self.pid_r, self.pid_w = os.pipe()
        os.set_blocking(self.pid_r, False)

    def __call__(self) -> int:
        """The child's pid (0 in the child); OSError when a fork failed."""
        middle = os.fork()
        if middle == 0:
            self._middle()  # returns in the grandchild only
            return 0
        os.waitpid(middle, 0)  # once it is gone, the grandchild is the agent's
        try:
            raw = os.read(self.pid_r, SPARE_PID.size)
        except BlockingIOError:  # its fork failed
            raw = b""
        if len(raw) != SPARE_PID.size:
            raise OSError(errno.EAGAIN, "the middle process could not fork")
        return int(SPARE_PID.unpack(raw)[0])

    def _middle(self) -> None:
        try:
            child = os.fork()
            if child == 0:
                os.close(self.pid_r)
                os.close(self.pid_w)
                return
            os.write(self.pid_w, SPARE_PID.pack(child))
        except BaseException:
            pass
        os._exit(0)


#: uname -m -> clone, get_robust_list and set_robust_list, and whether clone takes its
#: child_tid argument before tls (x86_64) or after it (the others).
CLONE_CALLS = {"x86_64": (56, 274, 273, True), "aarch64": (220, 100, 99, False)}
CLONE_PARENT = 0x00008000
CLONE_CHILD_SETTID = 0x01000000
#: glibc keeps a thread's id this far at most into its struct pthread (720 on 2.36),
#: which is longer than that.
TID_SCAN_BYTES = 1024


@dataclass(frozen=True, slots=True)
class SiblingFork:
    """fork(2) whose child is the caller's parent's child: clone(CLONE_PARENT).

    Python has no clone(), so it goes through ctypes, with what os.fork() and glibc's
    fork() do around the call: the interpreter's fork hooks (PyOS_*Fork*), the new
    thread id stored where glibc keeps it (CLONE_CHILD_SETTID; the place is found once,
    by ``probe``) and the robust futex list registered again.  ``probe`` gives None
    wherever any of that is unsure, and the zygote forks twice instead (MiddleFork).
    """

    syscall: Callable[..., int]
    clone_nr: int
    set_robust_list_nr: int
    child_tid_first: bool
    tid_address: int
    robust_head: int
    robust_len: int

    @classmethod
    def probe(cls) -> SiblingFork | None:
        calls = CLONE_CALLS.get(os.uname().machine)
        if calls is None or load_libc() is None:
            return None
        import ctypes

        syscall = ctypes.PyDLL(None, use_errno=True).syscall  # keeps the GIL, as os.fork
        syscall.restype = ctypes.c_long
        syscall.argtypes = [ctypes.c_long] * 6  # (variadic: longs, and always six)
        pthread_self = load_libc().pthread_self
        pthread_self.restype = ctypes.c_void_p
        self_address = pthread_self()
        head, length = ctypes.c_void_p(), ctypes.c_size_t()
        got = syscall(calls[1], 0, ctypes.addressof(head), ctypes.addressof(length), 0, 0)
        offset = _tid_offset(self_address) if self_address else None
        if got != 0 or offset is None or not head.value:
            return None
        return cls(
            syscall, calls[0], calls[2], calls[3], self_address + offset, head.value, length.value
        )

    def __call__(self) -> int:
        """The child's pid (0 in the child); OSError when clone failed."""
        import ctypes

        flags = CLONE_PARENT | CLONE_CHILD_SETTID | signal.SIGCHLD
        tids = (0, self.tid_address, 0) if self.child_tid_first else (0, 0, self.tid_address)
        ctypes.pythonapi.PyOS_BeforeFork()
        pid = self.syscall(self.clone_nr, flags, 0, *tids)
        if pid == 0:
            self.syscall(self.set_robust_list_nr, self.robust_head, self.robust_len, 0, 0, 0)
            ctypes.pythonapi.PyOS_AfterFork_Child()
            return 0
        error = ctypes.get_errno()
        ctypes.pythonapi.PyOS_AfterFork_Parent()
        if pid < 0:
            raise OSError(error, f"clone: {os.strerror(error)}")
        return int(pid)


def _tid_offset(self_address: int) -> int | None:
    """Where glibc keeps this (main) thread's id in its struct pthread, if sure.

    Its id is the pid here; a child that glibc forked has its own pid there.  The one
    place that holds both is the field: any other is a coincidence, and more than one
    place (or none) means unsure.
    """
    import ctypes

    def places(value: int) -> set[int]:
        raw = ctypes.string_at(self_address, TID_SCAN_BYTES)
        return {
            at for at in range(0, TID_SCAN_BYTES, 4) if raw[at : at + 4] == SPARE_PID.pack(value)
        }

    here = places(os.getpid())
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.write(write_end, json.dumps(sorted(places(os.getpid()))).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with open(read_end, "rb") as answer:
        there = answer.read()
    os.waitpid(child, 0)
    both = here & set(json.loads(there or b"[]"))
    return both.pop() if len(both) == 1 else None


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
        argv = [sys.executable, *flags, AGENT_FILE, ZYGOTE_FLAG, str(agent_pid), str(nice)]
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
        _signal_quietly(self.pid, signal.SIGCONT)  # a stray may have stopped it
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
            _signal_quietly(spare.pid, signal.SIGKILL)
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
                _signal_quietly(spare.pid, signal.SIGCONT)  # a stray may have stopped it
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
        _signal_quietly(self.pid, signal.SIGCONT)  # a stray may have stopped it
        self.ctl.settimeout(SPARE_WAIT_S)
        while self.asked:
            data, fds, _, _ = socket.recv_fds(self.ctl, SPARE_PID.size, 1)
            self.asked -= 1
            if len(data) != SPARE_PID.size:
                _close_all(fds)
                raise ConnectionResetError(errno.ECONNRESET, "the zygote hung up")
            pid = SPARE_PID.unpack(data)[0]
            # A stray may have killed it between its fork and now: a dead pid kept as a
            # helper would shield whatever process later reuses that pid from reset.
            if pid and len(fds) == 1 and running_child(pid):
                self.spares.append(Spare(pid, socket.socket(fileno=fds[0])))
            else:
                _close_all(fds)

    def _lost(self) -> None:
        """Drop the zygote (killed first: it may be alive but out of step)."""
        if self.pid:
            _signal_quietly(self.pid, signal.SIGKILL)
        if self.ctl is not None:
            self.ctl.close()
        self.pid, self.ctl, self.asked = 0, None, 0


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


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


# --------------------------------------------------------------------------- one execution


@dataclass(slots=True)
class Outcome:
    status: str
    exit_code: int | None = None
    signal: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    error: str | None = None


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
            _close_all([*child_ends, *parent_ends.values()])
            return Outcome("infra_error", error=f"cannot start the run: {exc}")
        try:
            _close_all(child_ends)
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
        _signal_quietly(self.pid, signal.SIGKILL)
        _signal_quietly(self.pid, signal.SIGKILL, group=True)
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
            _signal_quietly(self.pid, signal.SIGKILL)
            _signal_quietly(self.pid, signal.SIGKILL, group=True)
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


# --------------------------------------------------------------------------- the server


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
            count = extract_workdir(self.opts.workdir, _b64(req.get("data_b64"), "data_b64"))
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
            write_files(self.opts.workdir, spec.files)
            argv, code_file = self._command(spec)
            outcome = self._execute(conn, spec, argv)
        except (BadRequest, Cancelled):
            raise
        except OSError as exc:
            outcome = Outcome("infra_error", error=f"{type(exc).__name__}: {exc}")
        finally:
            if code_file is not None:
                _remove_scratch(os.path.dirname(code_file))
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


def encode_outcome(exec_id: str, o: Outcome) -> dict[str, Any]:
    return {
        "id": exec_id,
        "status": o.status,
        "exit_code": o.exit_code,
        "signal": o.signal,
        "stdout_b64": base64.b64encode(o.stdout).decode("ascii"),
        "stderr_b64": base64.b64encode(o.stderr).decode("ascii"),
        "stdout_truncated": o.stdout_truncated,
        "stderr_truncated": o.stderr_truncated,
        "duration_s": o.duration_s,
        "error": o.error,
    }


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


def _remove_scratch(path: str) -> None:
    """Remove the code directory with what a run built there; reset sees to anything left."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            remove_tree(path)
    except (OSError, RecursionError):
        pass


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


def _on_signal(signum: int, _frame: types.FrameType | None) -> None:
    raise Terminated(signum)


def _ignore_signal(_signum: int, _frame: types.FrameType | None) -> None:
    """SIGCHLD's handler: its only job is the byte the wake-up fd gets."""


def log(message: str) -> None:
    try:
        print(f"temper-agent[{os.getpid()}]: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def harden() -> None:
    """Keep code (same uid) out of the agent and its helpers; see "Hardening" above."""
    if not prctl(PR_SET_DUMPABLE, 0):  # no ptrace, no /proc/<agent>/mem for code
        log("cannot make the agent non-dumpable (no libc?)")
    # Spares are orphaned to the agent (see the zygote): as PID 1 it is their reaper
    # anyway; elsewhere (the local backends) it must ask to be.
    if not prctl(PR_SET_CHILD_SUBREAPER, 1) and os.getpid() != 1:
        log("cannot become a subreaper: runs will not start")
    why_not = install_seccomp_filter()
    if why_not is not None:
        log(f"no seccomp filter of our own ({why_not}); helpers stay non-dumpable")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == [ZYGOTE_FLAG]:  # a replacement zygote, exec-ed by the agent
        zygote_main(socket.socket(fileno=ZYGOTE_FD), int(args[1]), int(args[2]))
    opts = parse_options(args)
    if opts.container and 1 not in (os.getpid(), os.getppid()):
        # --container kills every process it can see: only where PID 1 is ours.
        log("refusing --container: the agent is neither PID 1 nor its child (not a container?)")
        return 2
    # Runs get a fresh environment each; the agent's own is a run's without the request's.
    os.environ.clear()
    os.environ.update(run_environment(opts.workdir))
    harden()
    zygote = Zygote(opts.run_nice)
    zygote.start(fresh=False)  # forked before any request is read: nothing to leak
    zygote.ask()
    agent = Agent(opts, zygote)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    agent.watch_children()
    try:
        agent.listen()
        log(f"listening on {opts.socket_path} (workdir {opts.workdir}, v{VERSION})")
        gc.freeze()  # the agent's long-lived objects leave the GC's generations
        agent.serve_forever()
    except Terminated:
        pass
    finally:
        agent.close()
        if opts.container:
            kill_strays()
        reap_children()
    return 0


if __name__ == "__main__":
    sys.exit(main())
