"""A warm pool of sandboxes, whatever creates them: idle ones wait ready, used ones are reset."""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from protocol.messages import SandboxStatus
from services.runtime.logs import get_logger
from services.runtime.tasks import run_to_end
from services.sandbox.agent_client import (
    AgentError,
    AgentTimeout,
    AgentUnavailable,
    ExecReply,
    ExecRequest,
)
from services.sandbox.backend import Box, Outcome, SandboxUnavailable
from services.sandbox.images import TaskImage
from services.sandbox.limits import Shape, container_shape
from services.sandbox.settings import Limits, SandboxSettings

#: An idle agent answers a ping in about a millisecond; this is for a loaded machine.
HEALTH_PING_TIMEOUT_S = 5.0


@dataclass(eq=False)
class _Tier:
    """Warm sandboxes of one shape and user, ready in ``idle``."""

    user: str
    shape: Shape
    #: How many are kept (idle or leased); 0 until first wanted, for the checker tier.
    size: int
    idle: asyncio.Queue[Box] = field(default_factory=asyncio.Queue)
    creating: int = 0


class WarmPool(abc.ABC):
    """Keeps ``pool_size`` sandboxes of the default shape; others are made on demand.

    Used sandboxes are reset and reused; one that is spoiled (timeout, OOM, agent lost)
    or worn out (``max_uses``) is replaced in the background.  Checker sandboxes (the
    ``checker_user``, for checks that must run where no candidate ever was) are a tier of
    their own: fresh, used once, never reset for reuse; ``checker_pool_size`` of them are
    kept warm once the first is asked for.
    """

    name = "pool"

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        code_shape = container_shape(settings.defaults, settings.user)
        self._code = _Tier(settings.user, code_shape, settings.pool_size)
        checker_shape = container_shape(settings.defaults, settings.checker_user)
        self._checker = _Tier(settings.checker_user, checker_shape, 0)
        self._creates = asyncio.Semaphore(settings.max_creates)
        self._wanted = asyncio.Event()
        self._boxes: dict[str, Box] = {}
        self._chores: set[asyncio.Task[None]] = set()
        self._log = get_logger(component=f"{self.name}-backend")
        self.created = 0
        self.recycled = 0
        self.cold_start_s: list[float] = []

    # ---------------------------------------------------------------- subclass hooks

    @abc.abstractmethod
    async def _spawn(self, limits: Limits, user: str, image: TaskImage | None = None) -> Box:
        """Create and start one sandbox whose agent answers, its code running as ``user``,
        of ``image`` when it is not the configured one."""

    @abc.abstractmethod
    async def _destroy(self, box: Box) -> None:
        """Remove a sandbox and everything it left on the host."""

    async def _kill(self, box: Box) -> None:
        """End a sandbox whose agent does not answer (the outer watchdog)."""
        await self._destroy(box)

    def _inspect(self, box: Box) -> None:  # noqa: B027 (optional hook: nothing to check here)
        """Before a used sandbox is reset: set ``spoiled`` if it must not be reused."""

    # ---------------------------------------------------------------- pool

    async def maintain(self) -> None:
        """Keep the tiers' warm sandboxes, and the idle ones alive (see _sweep)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._refill())
            group.create_task(self._sweep())

    async def _refill(self) -> None:
        """Keep each tier full, creating at most ``max_creates`` at once."""
        self._wanted.set()
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            # A TaskGroup, not gather: cancelled, it waits for every creation to clean up
            # (gather returns at the first cancelled child, orphaning containers mid-create).
            async with asyncio.TaskGroup() as group:
                for tier in (self._code, self._checker):
                    for _ in range(tier.size - self._warm_count(tier) - tier.creating):
                        group.create_task(self._warm_one(tier))

    def _warm_count(self, tier: _Tier) -> int:
        """Sandboxes of the tier's shape, idle or leased: its ``size`` bounds them all."""
        return sum(1 for box in self._boxes.values() if box.shape == tier.shape)

    async def _warm_one(self, tier: _Tier) -> None:
        tier.creating += 1
        try:
            box = await self._create(self.settings.defaults, tier.user)
        except Exception as error:  # the engine may be briefly unavailable; try again shortly
            self._log.error("warm_create_failed", error=repr(error))
            await asyncio.sleep(1.0)
            self._wanted.set()
            return
        finally:
            tier.creating -= 1
        tier.idle.put_nowait(box)

    async def _create(self, limits: Limits, user: str, image: TaskImage | None = None) -> Box:
        async with self._creates:
            started = time.perf_counter()
            box = await self._spawn(limits, user, image)
        self._boxes[box.id] = box
        self.created += 1
        self.cold_start_s = [*self.cold_start_s[-99:], time.perf_counter() - started]
        return box

    async def acquire(
        self, limits: Limits, *, checker: bool = False, image: TaskImage | None = None
    ) -> Box:
        tier = self._checker if checker else self._code
        if image is not None:
            # A task image's sandbox is its own: its shape names the image, so it is never
            # counted in a tier, nor reset for reuse.
            return await self._create(limits, tier.user, image)
        if checker and tier.size == 0:
            tier.size = self.settings.checker_pool_size
            self._wanted.set()
        if container_shape(limits, tier.user) != tier.shape:
            return await self._create(limits, tier.user)  # unusual limits: a dedicated sandbox
        box = self._take_idle(tier)
        if box is not None:  # the common case: no timer to arm, no wait
            return box
        try:
            async with asyncio.timeout(self.settings.acquire_timeout_s):
                while True:
                    box = self._check_out(await tier.idle.get())
                    if box is not None:
                        return box
        except TimeoutError:
            self._wanted.set()
            raise SandboxUnavailable(
                f"no sandbox free within {self.settings.acquire_timeout_s}s"
            ) from None

    def _take_idle(self, tier: _Tier) -> Box | None:
        """An idle sandbox of the tier that is ready now, if there is one."""
        while not tier.idle.empty():
            box = self._check_out(tier.idle.get_nowait())
            if box is not None:
                return box
        return None

    def _check_out(self, box: Box) -> Box | None:
        """The box, unless its agent hung up while it waited (the container died)."""
        if not box.agent.dead:
            return box
        # _retire asks for a replacement once this one is gone.
        self._chore(self._retire(box, "its agent hung up while idle"))
        return None

    def _reusable(self, box: Box) -> bool:
        """Not worn out (``max_uses``) and of the code tier's shape (never a checker's):
        reset, then reused."""
        return box.uses < self.settings.max_uses and box.shape == self._code.shape

    async def release(self, box: Box) -> None:
        self._inspect(box)
        if box.spoiled is None and self._reusable(box):
            try:
                # After a last exec this reads the answer of the reset the agent did unasked.
                await box.agent.reset(timeout_s=5.0)
            except AgentError as error:
                box.spoiled = f"reset failed: {error}"
            else:
                self._code.idle.put_nowait(box)
                return
        await self._discard(box)
        self._wanted.set()

    async def _discard(self, box: Box) -> None:
        # Stopping the service cancels this: a removal abandoned half-way would leave the
        # sandbox behind, no longer in _boxes for close() to find.
        await run_to_end(self._dispose(box))
        self.recycled += 1

    async def _dispose(self, box: Box) -> None:
        try:
            await box.agent.close()
            await self._destroy(box)
        finally:
            # Only once it is gone: pool_size bounds the containers that exist, so its
            # replacement is not started while it is still being removed.
            self._boxes.pop(box.id, None)

    async def close(self) -> None:
        await asyncio.gather(*self._chores, return_exceptions=True)
        boxes = list(self._boxes.values())
        await asyncio.gather(*(self._discard(box) for box in boxes), return_exceptions=True)

    # ---------------------------------------------------------------- health

    async def _sweep(self) -> None:
        """Every ``health_interval_s``: replace idle sandboxes that died (the container
        was killed, the agent hangs) before a request meets one and fails for it."""
        interval = self.settings.health_interval_s
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            for tier in (self._code, self._checker):
                idle = [tier.idle.get_nowait() for _ in range(tier.idle.qsize())]
                await asyncio.gather(*(self._check(box, tier) for box in idle))

    async def _check(self, box: Box, tier: _Tier) -> None:
        """Back to the idle queue once its agent answers a ping (at once), else replaced."""
        try:
            if box.agent.dead:
                raise AgentUnavailable(box.agent.path, "connection closed")
            await box.agent.ping(timeout_s=HEALTH_PING_TIMEOUT_S)
        except AgentError as error:
            await self._retire(box, f"dead while idle: {error}")
            return
        tier.idle.put_nowait(box)

    async def _retire(self, box: Box, reason: str) -> None:
        box.spoiled = reason
        self._log.warning("sandbox_replaced", sandbox=box.id[:12], reason=reason)
        await self._discard(box)
        self._wanted.set()

    def _chore(self, work: Coroutine[Any, Any, None]) -> None:
        """Run in the background, off the request's path; close() waits for it."""
        task = asyncio.get_running_loop().create_task(work)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    # ---------------------------------------------------------------- execution

    async def _run_agent(
        self, box: Box, request: ExecRequest, limits: Limits, last: bool
    ) -> ExecReply | Outcome:
        """The agent's reply, or the Outcome of a watchdog kill.

        ``last``: the box is released after this exec.  If it will be reused, its reset
        is sent as soon as the reply is in: the agent cleans up while the reply travels,
        and the next request finds the box ready sooner.
        """
        box.uses += 1
        watchdog = limits.timeout_s + self.settings.watchdog_grace_s
        reset_after = last and self._reusable(box)
        try:
            return await box.agent.exec(request, timeout_s=watchdog, reset_after=reset_after)
        except AgentTimeout:
            # The agent missed its own deadline: kill the sandbox for real.
            box.spoiled = "watchdog"
            await self._kill(box)
            return failed(request, SandboxStatus.TIMEOUT, "killed by the outer watchdog", watchdog)

    def statistics(self) -> dict[str, float]:
        starts = sorted(self.cold_start_s)
        return {
            "pool_idle": float(self._code.idle.qsize()),
            "pool_creating": float(self._code.creating + self._checker.creating),
            "checker_idle": float(self._checker.idle.qsize()),
            "sandboxes": float(len(self._boxes)),
            "sandboxes_created": float(self.created),
            "sandboxes_recycled": float(self.recycled),
            "cold_start_p50_s": starts[len(starts) // 2] if starts else 0.0,
        }


def failed(request: ExecRequest, status: SandboxStatus, error: str, duration_s: float) -> Outcome:
    reply = ExecReply(
        id=request.id,
        status=status,
        exit_code=None,
        signal=None,
        stdout=b"",
        stderr=b"",
        stdout_truncated=False,
        stderr_truncated=False,
        duration_s=duration_s,
        error=error,
    )
    return Outcome(reply=reply, status=status, error=error)
