"""The sandbox agent's socket: its host directory, and waiting until the agent answers.

Shared by the Docker and the local backends: each sandbox's agent listens on a unix
socket in a host directory of its own (bind-mounted at ``/run/temper`` in a container).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from services.sandbox.agent_client import AgentClient, AgentError
from services.sandbox.backend import SandboxUnavailable

READY_TIMEOUT_S = 20.0


def give_to_user(path: Path, user: str) -> None:
    """The agent (a non-root user in the container) creates its socket here."""
    if user.isdigit() and os.geteuid() == 0:
        os.chown(path, int(user), int(user))
    path.chmod(0o700)


def take_back(path: Path, user: str) -> None:
    """Once the agent listens, the sandbox user loses the directory (mode 0700).

    It is a host directory: left writable, code could fill the host's disk through it
    (past the tmpfs cap) or plant files there.  The agent keeps its listening socket.
    """
    if user.isdigit() and os.geteuid() == 0:
        os.chown(path, os.geteuid(), os.getegid())


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-500:]
    except OSError:
        return ""


#: AF_UNIX socket paths are limited to 107 bytes on Linux.
MAX_SOCKET_PATH = 107


def check_socket_path(path: Path) -> Path:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise SandboxUnavailable(
            f"agent socket path {str(path)!r} is over {MAX_SOCKET_PATH} bytes: "
            "use a shorter state_dir"
        )
    return path


async def wait_for_agent(
    path: Path, timeout_s: float = READY_TIMEOUT_S, log: Path | None = None
) -> AgentClient:
    """Connect once the sandbox's agent has created its socket and answers a ping."""
    deadline = time.monotonic() + timeout_s
    while True:
        if path.exists():  # noqa: ASYNC240 (one stat of a local socket path)
            with contextlib.suppress(AgentError, OSError):
                agent = await AgentClient.connect(path, timeout_s=2.0)
                await agent.ping()
                return agent
        if time.monotonic() > deadline:
            said = _tail(log) if log else ""
            detail = f"; it said: {said}" if said else ""
            raise SandboxUnavailable(f"sandbox agent did not come up within {timeout_s}s{detail}")
        await asyncio.sleep(0.01)
