"""The hidden test of an exported terminal task, run by its ``tests/test.sh``.

Exported as ``tests/check.py`` beside ``tests/checks.json``; it needs only python3's
standard library, so it runs in any image with python3::

    python3 check.py CHECKS_JSON WORKDIR REWARD_FILE

It does what the terminal validator does (services/validator/terminal.py and
terminal_probes.py), in the task's own container: each check's probe observes the work
directory (a bash command's exit status and output, or a file read without following a
symlink), and the observation is compared with the check's expected value.  The reward,
the share of checks that pass, is written to REWARD_FILE; one line per check says what
passed.  The comparisons must stay those of terminal_probes (a unit test holds them
equal).  Exit status: 0 when the reward was written, 2 when the checks file is unusable
(no reward is written: the run is invalid, not a score of 0).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: A probe's own environment, as the validator's: nothing of the agent's session.
CLEAN_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp/checker",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
SHELL = ["/bin/bash", "--noprofile", "--norc", "-c"]


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _pairs(text: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in text.split() if "=" in word)


def _ok(seen: str, value: Any) -> bool:
    return True  # a command that exited 0 observed something at all


def _text(seen: str, value: Any) -> bool:
    return bool(seen.strip() == value)


def _lines_are(seen: str, value: Any) -> bool:
    return bool(_lines(seen) == value)


def _json(seen: str, value: Any) -> bool:
    return bool(json.loads(seen) == value)


def _pairs_are(seen: str, value: Any) -> bool:
    return bool(_pairs(seen) == value)


def _lacks(seen: str, value: Any) -> bool:
    return isinstance(value, str) and value not in seen


COMPARE: dict[str, Callable[[str, Any], bool]] = {
    "ok": _ok,
    "text": _text,
    "lines": _lines_are,
    "json": _json,
    "pairs": _pairs_are,
    "lacks": _lacks,
}


def holds(expect: str, value: Any, seen: str | None) -> bool:
    """Whether an observation (None: nothing was observed) matches the expectation."""
    if seen is None:
        return False
    try:
        return COMPARE[expect](seen, value)
    except (ValueError, TypeError, RecursionError):
        return False


def read_regular(workdir: Path, relative: str, limit: int) -> str | None:
    """The text of a regular file reached without following any symlink, or None."""
    *parents, name = relative.split("/")
    walk = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for part in parents:
            fd, parent = os.open(part, walk, dir_fd=fd), fd
            os.close(parent)
        # O_NONBLOCK: a FIFO planted there fails or reads empty instead of blocking.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd, parent = os.open(name, flags, dir_fd=fd), fd
        os.close(parent)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = _read_at_most(fd, limit + 1)
        return None if len(data) > limit else data.decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_at_most(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def run(workdir: Path, command: str, timeout_s: float, limit: int) -> str | None:
    """The stdout of ``command`` (bash, clean environment) when it exits 0 in time."""
    script = 'mkdir -p "$HOME" 2>/dev/null\n' + command
    # A session of its own: a timeout kills whatever the command started, too.
    process = subprocess.Popen(
        [*SHELL, script],
        cwd=workdir,
        env=CLEAN_ENV,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # Not communicate() again: a daemon that left the session may hold the pipe open.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
        return None
    if process.returncode != 0 or len(out) > limit:
        return None
    return out.decode("utf-8", "replace")


def passes(check: dict[str, Any], workdir: Path, timeout_s: float, limit: int) -> bool:
    probe = check["probe"]
    if "read" in probe:
        seen = read_regular(workdir, probe["read"], limit)
    else:
        seen = run(workdir, probe["run"], timeout_s, limit)
    return holds(probe["expect"], probe.get("value"), seen)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: check.py CHECKS_JSON WORKDIR REWARD_FILE", file=sys.stderr)
        return 2
    try:
        spec = json.loads(Path(argv[1]).read_text())
        checks, timeout_s, limit = spec["checks"], spec["timeout_s"], spec["output_bytes"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"check.py: {argv[1]} is not a checks file: {error}", file=sys.stderr)
        return 2
    if not checks:
        print(f"check.py: {argv[1]} holds no check", file=sys.stderr)
        return 2
    passed = 0
    for check in checks:
        ok = passes(check, Path(argv[2]), float(timeout_s), int(limit))
        passed += ok
        print(f"pass {check['name']}" if ok else f"FAIL {check['name']}: {check['message']}")
    reward = Path(argv[3])
    reward.parent.mkdir(parents=True, exist_ok=True)
    # Written whole, then renamed: a reader never sees half a number.
    partial = reward.with_name(reward.name + ".partial")
    partial.write_text(f"{passed / len(checks):.6g}\n")
    partial.replace(reward)
    print(f"{passed}/{len(checks)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
