"""Work that must not stop half-way when the task awaiting it is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def run_to_end(work: Awaitable[T]) -> T:
    """Await ``work``; cancelled meanwhile, let it finish first, then raise the cancellation.

    For clean-up such as removing a container and its host directory: a service stopping
    cancels its tasks, and an abandoned removal would leave the container (or its files)
    behind with nothing left that knows about it.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            # A second cancellation ends this wait only: the work itself goes on.
            await asyncio.wait([task])
        raise
