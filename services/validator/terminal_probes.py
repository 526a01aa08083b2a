"""The checks of a terminal task as probes: what runs in the checker's sandbox, and the
comparison with the expected value, which happens here, in the validator's process.

A check in ``task.metadata["checks"]`` is ``{"name", "message", "probe": {"run" | "read",
"expect", "value"}}`` (see :mod:`services.domains.terminal.base`).  A ``run`` is a bash
command; a ``read`` is a work-directory file sent back as it is (a symlink, a FIFO, a
directory or a file over the output limit is absent).  The older form
``{"name", "message", "condition"}`` is a ``run`` expecting exit status 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from protocol.messages import SandboxResult, SandboxStatus

#: The probe's own environment: nothing of the sandbox's (whose HOME is the work
#: directory, where a ``.local`` user site or a ``.bashrc`` may wait), a fixed PATH
#: without the work directory, HOME an empty place outside it, no user site for any
#: Python the probe starts.  Absolute paths: no lookup that a planted file could answer.
CLEAN_ENV: Final = (
    "/usr/bin/env",
    "-i",
    "PATH=/usr/local/bin:/usr/bin:/bin",
    "HOME=/tmp/checker",
    "TMPDIR=/tmp",
    "LANG=C.UTF-8",
    "PYTHONNOUSERSITE=1",
    "PYTHONDONTWRITEBYTECODE=1",
)
#: bash without startup files (no .bashrc, .profile or BASH_ENV: the env is emptied).
SHELL: Final = ("/bin/bash", "--noprofile", "--norc", "-c")
#: A read probe runs nothing of the candidate's: the agent reads the file after it.
NOTHING: Final = ["/bin/true"]
EXPECTS: Final = frozenset({"ok", "text", "lines", "json", "pairs", "lacks"})


@dataclass(frozen=True, kw_only=True)
class Probe:
    run: str | None
    read: str | None
    expect: str
    value: Any


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    message: str
    probe: Probe


def parse_check(raw: object) -> Check | None:
    """A check from the task's metadata, or None when it is not one."""
    if not isinstance(raw, dict):
        return None
    name, message = raw.get("name"), raw.get("message")
    if not (isinstance(name, str) and name.isidentifier() and isinstance(message, str)):
        return None
    if isinstance(raw.get("condition"), str) and "probe" not in raw:
        probe = Probe(run=raw["condition"], read=None, expect="ok", value=None)
        return Check(name=name, message=message, probe=probe)
    body = raw.get("probe")
    if not isinstance(body, dict) or body.get("expect") not in EXPECTS:
        return None
    run, read = body.get("run"), body.get("read")
    if not ((isinstance(run, str) and read is None) or (isinstance(read, str) and run is None)):
        return None
    probe = Probe(run=run, read=read, expect=body["expect"], value=body.get("value"))
    return Check(name=name, message=message, probe=probe)


def argv(probe: Probe) -> tuple[list[str], list[str]]:
    """The command a probe executes and the files it asks back."""
    if probe.read is not None:
        return list(NOTHING), [probe.read]
    assert probe.run is not None
    # HOME must exist for programs that write there; it is made empty in a fresh /tmp.
    script = 'mkdir -p "$HOME" 2>/dev/null\n' + probe.run
    return [*CLEAN_ENV, *SHELL, script], []


def observed(probe: Probe, result: SandboxResult) -> str | None:
    """The probe's observation (stdout, or the file's text), or None when it failed: a
    command that ended badly, a file that was not there as a regular file."""
    if probe.read is not None:
        data = result.outputs.get(probe.read)
        return None if data is None else data.decode("utf-8", "replace")
    if result.status is not SandboxStatus.OK or result.stdout_truncated:
        return None
    return result.stdout


def holds(probe: Probe, seen: str | None) -> bool:
    """Whether the observation matches what the probe expects."""
    if seen is None:
        return False
    try:
        return _COMPARE[probe.expect](seen, probe.value)
    except (ValueError, TypeError, RecursionError):
        return False


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _pairs(text: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in text.split() if "=" in word)


def _json(text: str, value: Any) -> bool:
    return bool(json.loads(text) == value)


def _text(seen: str, value: Any) -> bool:
    return bool(seen.strip() == value)


def _lines_are(seen: str, value: Any) -> bool:
    return bool(_lines(seen) == value)


def _pairs_are(seen: str, value: Any) -> bool:
    return bool(_pairs(seen) == value)


def _lacks(seen: str, value: Any) -> bool:
    return isinstance(value, str) and value not in seen


def _ok(seen: str, value: Any) -> bool:
    return True  # the command exited 0: ``observed`` saw to it


_COMPARE: Final[dict[str, Callable[[str, Any], bool]]] = {
    "ok": _ok,
    "text": _text,
    "lines": _lines_are,
    "json": _json,
    "pairs": _pairs_are,
    "lacks": _lacks,
}
