"""What a sandbox backend offers the service, whatever isolates the code (Docker, bubblewrap...)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from protocol.messages import SandboxStatus
from services.sandbox.agent_client import AgentClient, ExecReply, ExecRequest
from services.sandbox.images import TaskImage
from services.sandbox.limits import Shape
from services.sandbox.settings import Limits


class SandboxUnavailable(Exception):
    """No sandbox could be had in time (pool exhausted, engine down): an infrastructure failure."""


@dataclass(eq=False)
class Box:
    """One leased sandbox: an agent behind a socket, plus what the backend needs to manage it."""

    id: str
    agent: AgentClient
    shape: Shape
    uses: int = 0
    #: Set when the box must not be reused (timeout, OOM, agent lost...).
    spoiled: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    reply: ExecReply
    #: The status after the backend's own checks (an agent's ``killed`` may really be ``oom``).
    status: SandboxStatus
    error: str | None = None


class Backend(Protocol):
    name: str

    async def start(self) -> None: ...

    async def maintain(self) -> None:
        """Background work (keep the warm pool full); runs until cancelled."""

    async def task_image(self, name: str) -> TaskImage:
        """Image ``name`` checked as a task image a session may run (a Harbor label, a work
        directory that can be mounted), or :class:`ImageRefused` saying why not."""

    async def acquire(
        self, limits: Limits, *, checker: bool = False, image: TaskImage | None = None
    ) -> Box:
        """A sandbox for ``limits``; ``checker``: a fresh one of the checker user, in which
        no candidate's code has ever run, used once and never reused; ``image``: a fresh
        one of that task image (cold, used once), its work directory still empty."""

    async def execute(
        self, box: Box, request: ExecRequest, limits: Limits, *, last: bool = False
    ) -> Outcome:
        """Run one exec; ``last``: ``release`` follows, the backend may start its reset early."""

    async def release(self, box: Box) -> None:
        """Reset and return the box to the pool, or replace it if it is spoiled or worn out."""

    async def close(self) -> None: ...

    def statistics(self) -> dict[str, float]: ...


def agent_status(reply: ExecReply) -> SandboxStatus:
    try:
        return SandboxStatus(reply.status)
    except ValueError:
        return SandboxStatus.INFRA_ERROR
