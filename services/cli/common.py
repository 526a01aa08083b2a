"""Helpers shared by the CLI commands."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from protocol.servers import NoServersGiven, server_list

T = TypeVar("T")


class CliError(Exception):
    """A failure to report in one line, with the exit code to use."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine on uvloop where available."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


async def connect(
    url: str, name: str = "temper-cli", timeout_s: float = 3.0, *, ride_through: bool = False
) -> NATS:
    """Connect once; a CLI command fails fast with a clear message instead of retrying.

    nats-py retries the first connection forever when ``max_reconnect_attempts`` is 0,
    hence one attempt, and a deadline over the whole call.  A long-running command that
    must outlive a restart of the server (``temper train``) asks to ``ride_through``:
    once connected, it reconnects for as long as it runs.
    """
    nc = NATS()
    try:
        await asyncio.wait_for(
            nc.connect(
                server_list(url),
                name=name,
                connect_timeout=max(1, math.ceil(timeout_s)),
                allow_reconnect=ride_through,
                max_reconnect_attempts=-1 if ride_through else 1,
                reconnect_time_wait=1 if ride_through else 0,
                error_cb=_silence,
            ),
            timeout_s + 1,
        )
    except (OSError, nats.errors.Error, TimeoutError, NoServersGiven) as error:
        with contextlib.suppress(nats.errors.Error, AssertionError):
            await nc.close()  # nats-py asserts if connect never got far enough
        cause = str(error) or type(error).__name__
        raise CliError(
            f"cannot reach NATS at {url} ({cause}); is the stack up (temper up)?"
        ) from None
    return nc


async def _silence(error: Exception) -> None:
    return None


def stop_event() -> asyncio.Event:
    """An event set by SIGINT/SIGTERM, so long commands end cleanly on Ctrl-C."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, event.set)
    return event


async def until(event: asyncio.Event, work: Awaitable[T]) -> T | None:
    """Await ``work`` unless ``event`` is set first (then cancel it and return None)."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(event.wait())
    await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def emit_json(value: Any) -> None:
    sys.stdout.write(msgspec.json.encode(value).decode() + "\n")
    sys.stdout.flush()
