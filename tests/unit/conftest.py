"""The unit tier starts no process and no server: a test that does belongs in tests/integration.

Every way this interpreter can start a process is refused during a unit test
(``subprocess``, ``asyncio``'s subprocesses and ``multiprocessing`` all end in
``fork_exec`` or ``posix_spawn``; ``os.fork`` besides), and the test fails naming what it
started, even when the code under test swallowed the error.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

#: Where a process can be started from Python, as (module, attribute).
SPAWNERS: tuple[tuple[Any, str], ...] = (
    (_posixsubprocess, "fork_exec"),
    (subprocess, "_fork_exec"),  # subprocess's own reference to it
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
)


class ProcessInUnitTest(BaseException):
    """BaseException: code under test that catches Exception must not hide it."""


@pytest.fixture(autouse=True)
def no_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    started: list[str] = []
    for module, name in SPAWNERS:
        monkeypatch.setattr(module, name, _refuse(started, f"{module.__name__}.{name}"))
    yield
    if started:
        pytest.fail(
            f"a unit test started a process ({', '.join(started)}): move it to tests/integration",
            pytrace=False,
        )


def _refuse(started: list[str], what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        started.append(what)
        raise ProcessInUnitTest(f"{what}: the unit tier starts no process")

    return refuse
