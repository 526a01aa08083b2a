"""The nats-py internals :class:`services.runtime.bus.Bus` calls, checked against the
installed nats-py: an upgrade that renames one, changes how it is called, or stops it
doing what the Bus relies on fails here, naming it.

Each name in ``NATS_PRIVATE_CALLS`` needs its call here, as ``Bus._write`` makes it.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.runtime.bus import NATS_PRIVATE_CALLS, Bus, ack_command
from tests.integration.support import client

#: The arguments ``Bus._write`` passes to each (after ``self``).
CALLS: dict[str, tuple[Any, ...]] = {
    "_send_command": (b"PING\r\n",),
    "_flush_pending": (),
}


def test_every_private_call_of_the_bus_is_checked_here() -> None:
    assert set(CALLS) == set(NATS_PRIVATE_CALLS), "add the call of each new name to CALLS"


@pytest.mark.parametrize("name", NATS_PRIVATE_CALLS)
def test_the_private_call_takes_the_arguments_the_bus_passes(name: str) -> None:
    method = getattr(Client, name, None)
    assert method is not None, f"nats-py's Client.{name} is gone (Bus._write calls it)"
    assert inspect.iscoroutinefunction(method), (
        f"nats-py's Client.{name} is no longer a coroutine function (Bus._write awaits it)"
    )
    try:
        inspect.signature(method).bind(Client(), *CALLS[name])
    except TypeError as error:
        pytest.fail(f"nats-py's Client.{name} no longer takes Bus._write's arguments: {error}")


async def test_commands_queued_by_the_private_calls_reach_the_server(nats_url: str) -> None:
    """What ``Bus._write`` relies on: bytes handed to ``_send_command`` go out verbatim,
    and ``_flush_pending`` gets them written without any public publish to follow."""
    received: asyncio.Queue[Msg] = asyncio.Queue()
    async with asyncio.timeout(10), client(nats_url) as watcher, client(nats_url) as nc:
        await watcher.subscribe("contract.>", cb=received.put)
        await Bus(watcher).flush()  # the server knows the subscription (see Bus.flush)
        commands = b"PUB contract.one 3\r\none\r\n" + ack_command("contract.two")
        await nc._send_command(commands)
        await nc._flush_pending()
        try:
            async with asyncio.timeout(2):
                first, second = await received.get(), await received.get()
        except TimeoutError:
            pytest.fail("_send_command + _flush_pending did not write the queued commands")
    assert (first.subject, first.data) == ("contract.one", b"one")
    assert (second.subject, second.data) == ("contract.two", b"")
