"""A hard bound on each test, setup and teardown included.

pytest-timeout's signal fails a test that runs too long, but the teardown that follows
(closing the event loop, joining executor threads, stopping servers) has no bound: one
thread stuck in a C call then holds the whole run until CI kills it with nothing
printed.  This watchdog arms faulthandler for every test: past its timeout plus a
margin, every thread's stack goes to the terminal and the process exits, so a hang
costs minutes and names its place.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Iterator
from typing import IO

import pytest

#: Seconds past a test's own timeout before the watchdog ends the run: room for a
#: failing test's normal teardown.
MARGIN_S = 180.0


class Watchdog:
    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        # A duplicate of the terminal's stderr, taken before pytest captures fd 2.
        self._stream: IO[str] = os.fdopen(os.dup(sys.stderr.fileno()), "w")

    def limit_s(self, item: pytest.Item) -> float:
        marker = item.get_closest_marker("timeout")
        timeout = float(marker.args[0]) if marker and marker.args else self._default()
        return timeout + MARGIN_S if timeout > 0 else 0.0

    def _default(self) -> float:
        value = self._config.getini("timeout")
        return float(value) if value else 0.0

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        limit = self.limit_s(item)
        if limit > 0:
            faulthandler.dump_traceback_later(limit, exit=True, file=self._stream)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()


def install(config: pytest.Config) -> None:
    config.pluginmanager.register(Watchdog(config), "temper-watchdog")
