"""Helpers the ``temper`` CLI tests share: run the command as a subprocess, bounded.

No tests here.  The command runs as a user runs it (``python -m services``, the
``temper`` console script's module) with the environment of a plain shell: no
``PYTHONUNBUFFERED``, so output a test waits for must be flushed by the command itself.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The caller's environment minus what would hide a bug (unbuffered output, a default URL).
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "TEMPER_NATS_URL")}


@dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str


async def start(url: str, *argv: str, stdin: int | None = None) -> asyncio.subprocess.Process:
    """Start ``temper --nats-url URL ARGV...`` with piped output."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services",
        "--nats-url",
        url,
        *argv,
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env=ENV,
    )


async def finish(
    proc: asyncio.subprocess.Process, timeout_s: float = 30.0, stdin: bytes | None = None
) -> Done:
    """Wait for the command to end (killed after ``timeout_s``, failing the test)."""
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate(stdin)
    finally:
        if proc.returncode is None:
            proc.kill()
            # Not wait(): a pipe nobody reads stays paused once full and never sees EOF,
            # and 3.11's wait() waits for the pipes too.
            await proc.communicate()
    assert proc.returncode is not None
    return Done(proc.returncode, out.decode(), err.decode())


async def temper(url: str, *argv: str, timeout_s: float = 30.0) -> Done:
    """Run ``temper --nats-url URL ARGV...`` to its end."""
    return await finish(await start(url, *argv), timeout_s)


def free_port() -> int:
    """A loopback port nothing listens on (free when asked; tests use it at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
