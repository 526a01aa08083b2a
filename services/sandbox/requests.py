"""Checks of a sandbox request before anything runs: each refusal names the field."""

from __future__ import annotations

from pathlib import PurePosixPath

from protocol.errors import ErrorCode
from protocol.messages import SandboxExec
from services.runtime.errors import RequestRejected
from services.sandbox.settings import SandboxSettings

#: Outputs one exec may ask for (the agent's own cap).
MAX_OUTPUTS = 64


def check_exec(request: SandboxExec, language: str, settings: SandboxSettings) -> None:
    """Refuse an exec whose language is unknown, whose code, files and stdin are too
    large, or whose paths leave the work directory."""
    if request.code is not None and language not in settings.languages:
        known = ", ".join(settings.languages)
        raise RequestRejected(
            ErrorCode.BAD_REQUEST,
            f"unknown language {language!r} (known: {known})",
            field="$.language",
        )
    size = len((request.code or "").encode()) + sum(len(a) for a in request.command or [])
    size += sum(len(content) for content in request.files.values()) + len(request.stdin)
    if size > settings.max_code_bytes:
        raise RequestRejected(
            ErrorCode.TOO_LARGE,
            f"code, files and stdin total {size} bytes, "
            f"over the limit of {settings.max_code_bytes}",
            field="$.code",
        )
    for path in request.files:
        check_path(path)
    if len(request.outputs) > MAX_OUTPUTS:
        raise RequestRejected(
            ErrorCode.BAD_REQUEST,
            f"{len(request.outputs)} outputs asked for, over the limit of {MAX_OUTPUTS}",
            field="$.outputs",
        )
    for path in request.outputs:
        check_path(path, "$.outputs")


def check_path(path: str, field: str = "$.files") -> None:
    parts = PurePosixPath(path).parts
    if not path or path.startswith("/") or ".." in parts or "\x00" in path:
        raise RequestRejected(
            ErrorCode.BAD_REQUEST,
            f"file path {path!r} must be relative and stay in the work directory",
            field=field,
        )
