"""Temper sandbox agent: runs executions for the host over a unix socket.

A single-file, standard-library-only Python 3.11 program.  It is the command of every
sandbox container (``docker run --init``: tini is PID 1, the agent its child, non-root,
no capabilities, read-only root, tmpfs workdir) and is also run directly on the host by
the local backend.  It assumes a container only when given ``--container``.

    python3 agent.py --socket PATH --workdir DIR [--container] [--languages JSON]
                     [--nofile N] [--fsize-bytes N] [--memory-bytes N | --memory-mb N]
                     [--nproc N]
                     [--socket-mode OCTAL]

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
      process but PID 1 and the agent (a /proc scan inside the container's PID
      namespace); the container's other writable places (/tmp, /dev/shm,
      /dev/mqueue) are emptied too and its SysV IPC objects removed, so nothing one
      task leaves there reaches the next.  Without: nothing outside the agent's own
      process groups is touched (and each exec's group is already killed when the
      exec ends), so only the workdir is emptied; a process that left its group with
      setsid() survives on the host (the local backend's weak-isolation mode).

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
PR_SET_PDEATHSIG=SIGKILL (an agent that dies takes its running child with it).
Code runs as the agent's uid, so the agent makes itself non-dumpable: code cannot
ptrace it, nor read its memory, descriptors or environment through /proc (each child
is dumpable again, as a normal process).
Python code runs in a fork of the agent (interpreter already loaded; behaves as
``python3 -c``: __main__, atexit, non-daemon threads joined, traceback + exit 1 on an
uncaught exception); the forked child keeps the agent's hash seed, so set iteration
order repeats across executions.  Other languages exec a real binary with the code in
a file under ``<workdir>/.temper/``, removed afterwards.  The language table maps a
name to "python-fork", an argv template (``{file}`` = the code file, ``{workdir}``) or
``{"argv": [...], "suffix": ".c"}``; ``--languages`` JSON entries are merged over the
defaults (null removes one).  Request files never pass through a symlink and only
replace regular files (anything else is a bad request).

When the main process exits, its process group is killed: at once if the pipes are
closed, else after a 50 ms grace (a background child holding stdout open cannot hang
the exec).  The leader is reaped only after that kill, so the group id cannot have been
reused.  With ``--container``, a timeout, an output limit, a cancellation or an expired
grace also kills every other process but PID 1 and the agent (children that setsid()
away); a process that left the group quietly survives until ``reset``.  Every child of
the agent is reaped (after each request and once a second).
"""

from __future__ import annotations

import argparse
import atexit
import base64
import builtins
import errno
import gc
import io
import json
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
from dataclasses import dataclass, field, replace
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


def parse_language(name: str, entry: Any) -> Language:
    if entry == PYTHON_FORK:
        return Language(name, None)
    if isinstance(entry, list):
        entry = {"argv": entry}
    if not isinstance(entry, dict):
        raise ValueError(f"language {name!r}: expected {PYTHON_FORK!r}, a list or an object")
    argv, suffix = entry.get("argv"), entry.get("suffix", "")
    if not _is_str_list(argv) or not argv or not isinstance(suffix, str):
        raise ValueError(f"language {name!r}: argv must be a non-empty list of strings")
    return Language(name, tuple(argv), suffix)


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
    return Options(os.path.abspath(a.socket), workdir, a.container, languages, limits, mode)


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


def reap_children() -> int:
    """Reap every exited child of the agent without blocking; returns how many."""
    reaped = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            line = f.read()
    except OSError:
        return None
    return line[line.rfind(b")") + 2 :][:1].decode() or None


def live_strays(me: int) -> Iterator[int]:
    """Every live (non-zombie) process in our PID namespace but PID 1 and the agent.

    Only used with --container, where the namespace is the sandbox's own.
    """
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (1, me):
            state = _proc_state(int(name))
            if state is not None and state not in ("Z", "X"):
                yield int(name)


def kill_strays(deadline_s: float = KILL_WAIT_S) -> tuple[int, bool]:
    """SIGKILL every stray until none is left: (distinct pids killed, all gone)."""
    me, killed = os.getpid(), set[int]()
    end = time.monotonic() + deadline_s
    while True:
        alive = list(live_strays(me))
        if not alive:
            return len(killed), True
        for pid in alive:
            if _signal_quietly(pid, signal.SIGKILL):
                killed.add(pid)
        reap_children()
        if time.monotonic() > end:
            return len(killed), False
        time.sleep(0.001)


# --------------------------------------------------------------------------- the child


@dataclass(frozen=True, slots=True)
class ChildPlan:
    """What the forked child does: fds to wire up, where to run, what to run."""

    stdin_fd: int
    stdout_fd: int
    stderr_fd: int
    status_fd: int
    max_fd: int
    workdir: str
    env: dict[str, str]
    limits: Limits
    code: str | None
    argv: tuple[str, ...] | None
    inherited: tuple[Any, ...] = field(default=())
    #: libc prctl, to die with the agent (PR_SET_PDEATHSIG); None where unavailable.
    prctl: Callable[..., int] | None = None
    agent_pid: int = 0


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


def _wire_fds(plan: ChildPlan) -> None:
    """stdin/stdout/stderr onto 0/1/2, the status pipe onto 3 (close-on-exec), nothing else."""
    for obj in plan.inherited:  # sockets, selectors: close our copies while their fds are theirs
        try:
            obj.close()
        except OSError:
            pass
    os.dup2(plan.stdin_fd, 0)
    os.dup2(plan.stdout_fd, 1)
    os.dup2(plan.stderr_fd, 2)
    os.dup2(plan.status_fd, 3, inheritable=False)
    os.closerange(4, plan.max_fd)


def _reset_signals(python: bool) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler if python else signal.SIG_DFL)
    if not python:  # python ignores these itself; a real binary must start with defaults
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)


def load_libc() -> Any:
    """libc through ctypes (standard library, but optional in minimal builds); None without."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None


def _die_with_agent(plan: ChildPlan) -> None:
    """SIGKILL this child when the agent dies (an agent SIGKILL-ed on the host)."""
    if plan.prctl is None:
        return
    plan.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != plan.agent_pid:  # the agent died before prctl took effect
        os._exit(SETUP_FAILED)


def _enter(plan: ChildPlan) -> None:
    _die_with_agent(plan)
    if plan.prctl is not None:
        plan.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # the agent is not dumpable; code is, as usual
    os.chdir(plan.workdir)
    os.environ.clear()
    os.environ.update(plan.env)
    apply_limits(plan.limits)


def _text_stream(fd: int, write: bool, errors: str) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w" if write else "r", closefd=False)
    buffered = io.BufferedWriter(raw) if write else io.BufferedReader(raw)
    line_buffering = fd == 2  # as python3 does for a non-interactive stderr
    return io.TextIOWrapper(
        buffered, encoding="utf-8", errors=errors, newline="\n", line_buffering=line_buffering
    )


def _rebuild_stdio() -> None:
    """New sys.std* on fds 0/1/2 (the agent's own objects would write to its old buffers)."""
    streams = {
        "stdin": _text_stream(0, False, "surrogateescape"),
        "stdout": _text_stream(1, True, "surrogateescape"),
        "stderr": _text_stream(2, True, "backslashreplace"),
    }
    for name, stream in streams.items():
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


def run_python(code: str) -> int:
    """Run code as ``python3 -c`` would in this (forked) interpreter; the exit status."""
    _rebuild_stdio()
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


def run_child(plan: ChildPlan) -> NoReturn:
    """The forked child: set up, then run Python in place or exec the binary. Never returns."""
    python = plan.code is not None
    status_fd = plan.status_fd
    try:
        _reset_signals(python)
        os.setsid()
        _wire_fds(plan)
        status_fd = 3
        _enter(plan)
    except BaseException as exc:
        _report_setup_failure(status_fd, exc)
    if plan.code is not None:
        os.close(3)
        os._exit(run_python(plan.code))
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
    """One child: feed stdin, collect capped output, enforce the deadline, kill, reap.

    The pipes are watched by name ("stdin", "stdout", "stderr", "status", "pidfd") in
    ``fds``; a name leaves ``fds`` when its fd is closed.
    """

    def __init__(self, plan: ChildPlan, spec: ExecSpec, conn: socket.socket, container: bool):
        self.plan, self.spec, self.conn, self.container = plan, spec, conn, container
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

    def run(self, parent_ends: dict[str, int]) -> Outcome:
        """parent_ends: our ends of the pipes by name (all fds are ours to close from here).

        Raises Cancelled when the host hung up; a failed fork is an infra_error outcome.
        """
        start = time.monotonic()
        try:
            self.pid = os.fork()
        except OSError as exc:  # EAGAIN: the pids limit
            self.sel.close()
            self._close_child_ends()
            for fd in parent_ends.values():
                os.close(fd)
            return Outcome("infra_error", error=f"fork failed: {exc}")
        if self.pid == 0:
            run_child(self.plan)
        try:
            self._close_child_ends()
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

    def _close_child_ends(self) -> None:
        p = self.plan
        for fd in (p.stdin_fd, p.stdout_fd, p.stderr_fd, p.status_fd):
            os.close(fd)

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
            kill_strays()
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

    def __init__(self, opts: Options):
        self.opts = opts
        self.listener: socket.socket | None = None
        self.sel = selectors.DefaultSelector()
        self.conns: set[socket.socket] = set()
        self.max_fd = max(os.sysconf("SC_OPEN_MAX"), 1024)
        self.code_counter = 0
        self.libc = load_libc()
        self.prctl = getattr(self.libc, "prctl", None)

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

    def serve_forever(self) -> None:
        while True:
            for key, _ in self.sel.select(timeout=1.0):
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    self._serve_request(key.fileobj)  # type: ignore[arg-type]
            reap_children()

    def close(self) -> None:
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

    def _serve_request(self, conn: socket.socket) -> None:
        keep = True
        try:
            req = recv_frame(conn)
            if req is None:
                keep = False
            else:
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
            log(f"internal error: {''.join(traceback.format_exception(exc))}")
            keep = self._reply_error(conn, f"agent internal error: {exc!r}")
        if not keep:
            self._drop_conn(conn)

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
        killed, clean = kill_strays() if self.opts.container else (0, True)
        reap_children()
        if not clean:
            return {"ok": False, "error": "reset: processes survived SIGKILL", "killed": killed}
        try:
            os.makedirs(self.opts.workdir, mode=0o700, exist_ok=True)  # code may have removed it
            empty_dir(self.opts.workdir)
            if self.opts.container:
                wipe_container_scratch(self.libc)
        except (OSError, RecursionError) as exc:
            return {"ok": False, "error": f"reset: cannot clean up after the task: {exc}"}
        return {"ok": True, "killed": killed}

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
                _remove_quietly(code_file)
                _remove_quietly(os.path.dirname(code_file), directory=True)
            reap_children()
        return encode_outcome(spec.id, outcome)

    def _command(self, spec: ExecSpec) -> tuple[tuple[str, ...] | None, str | None]:
        """argv to exec (None: python fork path) and the code file to remove afterwards."""
        if spec.argv is not None:
            return spec.argv, None
        language = spec.language
        assert language is not None and spec.code is not None
        if language.argv is None:
            return None, None
        if shutil.which(language.argv[0], path=spec.env.get("PATH", DEFAULT_PATH)) is None:
            raise OSError(errno.ENOENT, f"{language.name} interpreter not found", language.argv[0])
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
            stdin_fd=stdin_r,
            stdout_fd=out_w,
            stderr_fd=err_w,
            status_fd=status_w,
            max_fd=self.max_fd,
            prctl=self.prctl,
            agent_pid=os.getpid(),
            workdir=self.opts.workdir,
            env=self._child_env(spec),
            limits=spec.limits,
            code=spec.code if argv is None else None,
            argv=argv,
            inherited=(self.sel, *self.conns, *([self.listener] if self.listener else [])),
        )
        ends = {"stdin": stdin_w, "stdout": out_r, "stderr": err_r, "status": status_r}
        try:
            sys.stderr.flush()  # or the child could flush the agent's buffered text into its pipes
        except (OSError, ValueError):
            pass
        return Execution(plan, spec, conn, self.opts.container).run(ends)

    def _child_env(self, spec: ExecSpec) -> dict[str, str]:
        env = {
            "PATH": DEFAULT_PATH,
            "HOME": self.opts.workdir,
            "TMPDIR": self.opts.workdir,
            "LANG": "C.UTF-8",
        }
        env.update(spec.env)
        return env


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


def _remove_quietly(path: str, directory: bool = False) -> None:
    try:
        (os.rmdir if directory else os.unlink)(path)
    except OSError:
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


def log(message: str) -> None:
    try:
        print(f"temper-agent[{os.getpid()}]: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    opts = parse_options(argv)
    if opts.container and 1 not in (os.getpid(), os.getppid()):
        # --container kills every process it can see: only where PID 1 is our init.
        log("refusing --container: the agent is neither PID 1 nor its child (not a container?)")
        return 2
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    # Executions get a fresh environment each; keeping the agent's own small makes the
    # forked child's rebuild cheap.
    os.environ.clear()
    os.environ.update({"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"})
    agent = Agent(opts)
    if agent.prctl is not None:
        agent.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace, no /proc/<agent>/mem for code
    try:
        agent.listen()
        log(f"listening on {opts.socket_path} (workdir {opts.workdir}, v{VERSION})")
        gc.freeze()  # forked children then do not touch (copy) the agent's objects in a GC pass
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
