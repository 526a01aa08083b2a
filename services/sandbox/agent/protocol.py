"""Wire protocol (host <-> agent; internal, not part of the NATS protocol)
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
                "fsize_bytes": int|null} | null, "outputs": [relpath]}
      -> {"id": str, "status": "ok" | "nonzero_exit" | "timeout" | "output_limit"
                               | "killed" | "infra_error",
          "exit_code": int | null, "signal": int | null,
          "stdout_b64": str, "stderr_b64": str,
          "stdout_truncated": bool, "stderr_truncated": bool,
          "duration_s": float, "error": str | null, "outputs_b64": {relpath: b64}}

      Exactly one of ``code`` and ``argv``.  ``language`` defaults to "python" for
      code and is ignored for argv.  ``files`` are written under the workdir first.
      Optional with defaults: stdin_b64 "", files {}, env {}, timeout_s 10,
      output_bytes 1 MiB (at most 16 MiB), limits null (the agent's options),
      outputs [] (at most 64 paths).
      ``outputs`` name files the run leaves in the workdir (an openscad render's
      out.stl): once the run is over, each that is a regular file, reached without
      passing through a symlink, comes back in ``outputs_b64`` while their total stays
      within output_bytes; a missing, other or oversized one is left out (an error of
      the run, not of the request).
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
      The workdir as a gzip tar (regular files, directories and symlinks, as links;
      devices, FIFOs and hard links are left out; at most MAX_ARCHIVE_BYTES of files,
      checked before compressing, and compressed): a session
      snapshot.  Modes are kept as code left them (no setuid bits), even those that
      shut the owner out: the agent opens them up while it reads, then puts them back.
      A workdir that cannot be archived (too big, unreadable) is ``ok: false``.

    {"op": "extract", "data_b64": str} -> {"ok": true, "files": N}
      Empty the workdir, then unpack an archive made by ``archive`` into it (links
      and modes last); members that are not regular files, directories or symlinks,
      or whose path leaves the workdir,
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
"""

from __future__ import annotations

import base64
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from .common import HEADER, BadRequest, FrameTooLarge, get_field, is_str_list
from .languages import Language
from .limits import Limits, parse_limits
from .options import Options

VERSION = 1
MAX_FRAME = 64 * 1024 * 1024
MAX_OUTPUT_BYTES = 16 * 1024 * 1024
MAX_TIMEOUT_S = 24 * 3600.0
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_OUTPUT_BYTES = 1024 * 1024
MAX_OUTPUTS = 64


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
    #: Files the run leaves in the workdir that the reply carries back.
    outputs: tuple[str, ...] = ()


def b64_field(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise BadRequest(f"{where}: expected a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise BadRequest(f"{where}: invalid base64") from exc


def check_relpath(rel: Any, where: str = "files") -> str:
    """A file path from a request: relative, normalised, never leaving the workdir."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise BadRequest(f"{where}: invalid path {rel!r}")
    if os.path.isabs(rel):
        raise BadRequest(f"{where}: absolute path {rel!r}")
    parts = rel.split("/")
    if ".." in parts:
        raise BadRequest(f"{where}: path {rel!r} leaves the workdir")
    norm = os.path.normpath(rel)
    if norm == ".":
        raise BadRequest(f"{where}: path {rel!r} names the workdir")
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
        name = get_field(req, "language", str, "python")
        language = opts.languages.get(name)
        if language is None:
            raise BadRequest(f"unknown language {name!r}; known: {sorted(opts.languages)}")
    elif not is_str_list(argv) or not argv or any("\0" in a for a in argv):
        raise BadRequest("argv: expected a non-empty list of strings")
    files_raw = get_field(req, "files", dict, {})
    files = {check_relpath(k): b64_field(v, f"files[{k!r}]") for k, v in files_raw.items()}
    timeout_s = float(get_field(req, "timeout_s", (int, float), DEFAULT_TIMEOUT_S))
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise BadRequest(f"timeout_s: must be in (0, {MAX_TIMEOUT_S}]")
    output_bytes = get_field(req, "output_bytes", int, DEFAULT_OUTPUT_BYTES)
    if not 0 < output_bytes <= MAX_OUTPUT_BYTES:
        raise BadRequest(f"output_bytes: must be in [1, {MAX_OUTPUT_BYTES}]")
    return ExecSpec(
        id=exec_id,
        language=language,
        code=code,
        argv=tuple(argv) if argv is not None else None,
        stdin=b64_field(req.get("stdin_b64") or "", "stdin_b64"),
        files=files,
        timeout_s=timeout_s,
        output_bytes=output_bytes,
        env=parse_env(req.get("env")),
        limits=parse_limits(req.get("limits"), opts.limits, opts.container),
        outputs=parse_outputs(req.get("outputs")),
    )


def parse_outputs(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not is_str_list(raw) or len(raw) > MAX_OUTPUTS:
        raise BadRequest(f"outputs: expected a list of at most {MAX_OUTPUTS} paths")
    return tuple(dict.fromkeys(check_relpath(rel, "outputs") for rel in raw))


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
    outputs: dict[str, bytes] = field(default_factory=dict)


def encode_outcome(exec_id: str, o: Outcome) -> dict[str, Any]:
    return {
        "id": exec_id,
        "status": o.status,
        "exit_code": o.exit_code,
        "signal": o.signal,
        "stdout_b64": _b64text(o.stdout),
        "stderr_b64": _b64text(o.stderr),
        "stdout_truncated": o.stdout_truncated,
        "stderr_truncated": o.stderr_truncated,
        "duration_s": o.duration_s,
        "error": o.error,
        "outputs_b64": {rel: _b64text(data) for rel, data in o.outputs.items()},
    }


def _b64text(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
