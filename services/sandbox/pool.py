"""A warm pool of sandboxes, whatever creates them: idle ones wait ready, used ones are reset."""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Coroutine
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
from services.sandbox.limits import container_shape
from services.sandbox.settings import Limits, SandboxSettings

#: An idle agent answers a ping in about a millisecond; this is for a loaded machine.
HEALTH_PING_TIMEOUT_S = 5.0


class WarmPool(abc.ABC):
    """Keeps ``pool_size`` sandboxes of the default shape; others are made on demand.

    Used sandboxes are reset and reused; one that is spoiled (timeout, OOM, agent lost)
    or worn out (``max_uses``) is replaced in the background.
    """

    name = "pool"

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self._idle: asyncio.Queue[Box] = asyncio.Queue()
        self._creating = 0
        self._creates = asyncio.Semaphore(settings.max_creates)
        self._wanted = asyncio.Event()
        self._boxes: dict[str, Box] = {}
        self._default_shape = container_shape(settings.defaults)
        self._chores: set[asyncio.Task[None]] = set()
        self._log = get_logger(component=f"{self.name}-backend")
        self.created = 0
        self.recycled = 0
        self.cold_start_s: list[float] = []

    # ---------------------------------------------------------------- subclass hooks

    @abc.abstractmethod
    async def _spawn(self, limits: Limits) -> Box:
        """Create and start one sandbox whose agent answers."""

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
        """Keep ``pool_size`` warm sandboxes, and the idle ones alive (see _sweep)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._refill())
            group.create_task(self._sweep())

    async def _refill(self) -> None:
        """Keep ``pool_size`` warm sandboxes, creating at most ``max_creates`` at once."""
        self._wanted.set()
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            missing = self.settings.pool_size - self._warm_count() - self._creating
            # A TaskGroup, not gather: cancelled, it waits for every creation to clean up
            # (gather returns at the first cancelled child, orphaning containers mid-create).
            async with asyncio.TaskGroup() as group:
                for _ in range(missing):
                    group.create_task(self._warm_one())

    def _warm_count(self) -> int:
        """Sandboxes of the default shape, idle or leased: ``pool_size`` bounds them all."""
        return sum(1 for box in self._boxes.values() if box.shape == self._default_shape)

    async def _warm_one(self) -> None:
        self._creating += 1
        try:
            box = await self._create(self.settings.defaults)
        except Exception as error:  # the engine may be briefly unavailable; try again shortly
            self._log.error("warm_create_failed", error=repr(error))
            await asyncio.sleep(1.0)
            self._wanted.set()
            return
        finally:
            self._creating -= 1
        self._idle.put_nowait(box)

    async def _create(self, limits: Limits) -> Box:
        async with self._creates:
            started = time.perf_counter()
            box = await self._spawn(limits)
        self._boxes[box.id] = box
        self.created += 1
        self.cold_start_s = [*self.cold_start_s[-99:], time.perf_counter() - started]
        return box

    async def acquire(self, limits: Limits) -> Box:
        if container_shape(limits) != self._default_shape:
            return await self._create(limits)  # unusual limits: a dedicated sandbox
        box = self._take_idle()
        if box is not None:  # the common case: no timer to arm, no wait
            return box
        try:
            async with asyncio.timeout(self.settings.acquire_timeout_s):
                while True:
                    box = self._check_out(await self._idle.get())
                    if box is not None:
                        return box
        except TimeoutError:
            self._wanted.set()
            raise SandboxUnavailable(
                f"no sandbox free within {self.settings.acquire_timeout_s}s"
            ) from None

    def _take_idle(self) -> Box | None:
        """An idle sandbox that is ready now, if there is one."""
        while not self._idle.empty():
            box = self._check_out(self._idle.get_nowait())
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
        """Not worn out (``max_uses``) and of the warm pool's shape: reset, then reused."""
        return box.uses < self.settings.max_uses and box.shape == self._default_shape

    async def release(self, box: Box) -> None:
        self._inspect(box)
        if box.spoiled is None and self._reusable(box):
            try:
                # After a last exec this reads the answer of the reset the agent did unasked.
                await box.agent.reset(timeout_s=5.0)
            except AgentError as error:
                box.spoiled = f"reset failed: {error}"
            else:
                self._idle.put_nowait(box)
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
            idle = [self._idle.get_nowait() for _ in range(self._idle.qsize())]
            await asyncio.gather(*(self._check(box) for box in idle))

    async def _check(self, box: Box) -> None:
        """Back to the idle queue once its agent answers a ping (at once), else replaced."""
        try:
            if box.agent.dead:
                raise AgentUnavailable(box.agent.path, "connection closed")
            await box.agent.ping(timeout_s=HEALTH_PING_TIMEOUT_S)
        except AgentError as error:
            await self._retire(box, f"dead while idle: {error}")
            return
        self._idle.put_nowait(box)

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
            "pool_idle": float(self._idle.qsize()),
            "pool_creating": float(self._creating),
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
