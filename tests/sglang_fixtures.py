"""Session fixtures for tests against a real CPU SGLang server (``deploy/sglang-cpu``).

Imported into tests/conftest.py.  The venv is located or built once (cached outside the
clone); without it the tests skip, except in CI (CI=true) or with
TEMPER_REQUIRE_SGLANG=1, where they fail.  Each server launch costs about 30 s and a few
hundred MB, so the session shares one server; a second one exists only for routing.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.engines.sglang.server import (
    DEPLOY_DIR,
    SGLangServer,
    SGLangServerError,
    SGLangServerSettings,
)
from services.engines.sglang.server import (
    sglang_python as find_sglang_python,
)
from tests.required import unavailable

__all__ = [
    "sglang_python",
    "sglang_second_server",
    "sglang_server",
    "sglang_server_factory",
]

BUILD_TIMEOUT_S = 1500

SGLangServerFactory = Callable[..., SGLangServer]


def _unavailable(reason: str) -> None:
    unavailable("the CPU SGLang server", reason, flag="TEMPER_REQUIRE_SGLANG")


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """The python of the SGLang venv, built by deploy/sglang-cpu/build.sh when missing."""
    try:
        found = find_sglang_python(os.environ)
    except SGLangServerError as error:
        _unavailable(str(error))
        raise
    if found is not None:
        return found
    started = time.monotonic()
    try:
        build = subprocess.run(
            [str(DEPLOY_DIR / "build.sh")], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        _unavailable(f"deploy/sglang-cpu/build.sh took over {BUILD_TIMEOUT_S}s")
        raise
    if build.returncode != 0:
        _unavailable(f"deploy/sglang-cpu/build.sh failed:\n{build.stderr[-3000:]}")
    print(f"SGLang venv built in {time.monotonic() - started:.0f}s")
    return Path(build.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def sglang_server_factory(
    sglang_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SGLangServerFactory]:
    """Launch a real server on a free loopback port (float32); all stop at session end."""
    servers: list[SGLangServer] = []

    def launch(**overrides: Any) -> SGLangServer:
        settings = SGLangServerSettings(
            model_path=overrides.pop("model_path", tiny_model),
            python=sglang_python,
            log_dir=tmp_path_factory.mktemp("sglang"),
            **overrides,
        )
        server = SGLangServer(settings)
        servers.append(server)
        # A loop of its own, never set as current: pytest-asyncio owns the tests' loops.
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(server.start())
        except SGLangServerError as error:
            # The venv is there, so a server that does not serve is a failure, not a skip.
            pytest.fail(f"SGLang server did not start: {error}")
        finally:
            loop.close()
        return server

    yield launch
    for server in servers:
        server.terminate()


@pytest.fixture(scope="session")
def sglang_server(sglang_server_factory: SGLangServerFactory) -> SGLangServer:
    """The session's server: tiny model, float32, raw logprobs."""
    return sglang_server_factory()


@pytest.fixture(scope="session")
def sglang_second_server(sglang_server_factory: SGLangServerFactory) -> SGLangServer:
    """A second server for routing tests.

    It runs with SGLang's default logprobs (temperature-scaled), so the same launch also
    tests that the engine refuses such a server; routing tests turn that check off.
    """
    return sglang_server_factory(extra_env={"SGLANG_RETURN_ORIGINAL_LOGPROB": "0"})
