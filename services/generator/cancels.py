"""Gateway calls whose client went away (``CallCancel``): the one being generated here
stops, and one that comes later (still queued, or redelivered) is dropped unanswered.

A cancel is broadcast to every generator, so most cancels name calls served elsewhere;
each is kept only until the call's own deadline, past which every generator refuses the
call anyway, so the memory of them stays bounded by the calls of one timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from protocol.messages import CallCancel

T = TypeVar("T")


class CallCancels:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        #: Task id -> the unix time its cancel stops mattering.
        self._cancelled: dict[str, float] = {}
        self._running: dict[str, asyncio.Task[Any]] = {}
        #: Calls stopped while generating, and calls dropped before they started.
        self.stopped = 0
        self.dropped = 0

    def cancel(self, message: CallCancel) -> None:
        self._forget_expired()
        self._cancelled[message.task_id] = message.until
        running = self._running.get(message.task_id)
        if running is not None and not running.done():
            running.cancel()

    def is_cancelled(self, task_id: str) -> bool:
        until = self._cancelled.get(task_id)
        return until is not None and until >= self._clock()

    async def run(self, task_id: str, work: Coroutine[Any, Any, T]) -> T | None:
        """``work``'s result, or None when the call was cancelled before or while it ran.
        A cancel of the caller itself (the service stopping) still propagates."""
        if self.is_cancelled(task_id):
            work.close()
            self.dropped += 1
            return None
        child = asyncio.create_task(work)
        self._running[task_id] = child
        try:
            return await child
        except asyncio.CancelledError:
            current = asyncio.current_task()
            mine = current is not None and current.cancelling() > 0
            if child.cancelled() and task_id in self._cancelled and not mine:
                self.stopped += 1
                return None
            raise
        finally:
            self._running.pop(task_id, None)

    def _forget_expired(self) -> None:
        now = self._clock()
        for task_id in [t for t, until in self._cancelled.items() if until < now]:
            del self._cancelled[task_id]

    def statistics(self) -> dict[str, float]:
        return {
            "calls_cancelled_running": float(self.stopped),
            "calls_cancelled_dropped": float(self.dropped),
        }
