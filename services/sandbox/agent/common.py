"""Constants, errors and helpers that every part of the agent shares."""

from __future__ import annotations

import os
import struct
import sys
from typing import Any

#: How long a frame may take to arrive once its first byte did, and a reply to be sent.
IO_TIMEOUT_S = 30.0
#: How long a reset waits for killed processes to disappear.
KILL_WAIT_S = 2.0
READ_CHUNK = 65536
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CODE_DIR = ".temper"
HEADER = struct.Struct(">I")
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


def is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def get_field(req: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = req.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BadRequest(f"{key}: wrong type {type(value).__name__}")
    return value


def log(message: str) -> None:
    try:
        print(f"temper-agent[{os.getpid()}]: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
