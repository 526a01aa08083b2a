"""Shared fixtures.  Integration tests get their own real nats-server on a free loopback port."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from tests.sglang_fixtures import (  # noqa: F401  (fixtures, used by name)
    sglang_python,
    sglang_second_server,
    sglang_server,
    sglang_server_factory,
)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream, storing under the test's tmp dir.

    There is no skip path: nats-server comes from a required dependency, so a
    missing binary is a broken install and the test must fail.
    """
    server = NatsServer(NatsServerSettings(store_dir=tmp_path / "nats", port=RANDOM_PORT))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


# ---------------------------------------------------------------- Docker

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "deploy" / "sandbox" / "build-offline.sh"
#: build-offline.sh's exit status when docker, debootstrap or root is missing.
PREREQUISITE_MISSING = 3
BUILD_TIMEOUT_S = 1200


def _unavailable(reason: str) -> None:
    """In CI (CI=true or TEMPER_REQUIRE_DOCKER=1) a missing engine fails; elsewhere it skips."""
    if os.environ.get("TEMPER_REQUIRE_DOCKER") == "1" or os.environ.get("CI") == "true":
        pytest.fail(f"Docker is required here (CI) but {reason}")
    pytest.skip(reason)


def _docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return "the Docker engine does not answer (docker info timed out)"
    if info.returncode != 0:
        return f"the Docker engine does not answer: {info.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """The offline sandbox image (built once; cached by content hash outside the clone).

    Without a Docker engine: skip, unless CI=true or TEMPER_REQUIRE_DOCKER=1, where it fails.
    """
    problem = _docker_problem()
    if problem is not None:
        _unavailable(problem)
    started = time.monotonic()
    build = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )
    if build.returncode == PREREQUISITE_MISSING:
        _unavailable(f"cannot build the sandbox image: {build.stderr.strip()[-300:]}")
    assert build.returncode == 0, f"build-offline.sh failed:\n{build.stderr[-4000:]}"
    tag = build.stdout.strip().splitlines()[-1]
    assert tag.startswith("temper-sandbox:"), build.stdout
    print(f"sandbox image {tag} ready in {time.monotonic() - started:.1f}s")
    return tag


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 policy of ``temper model init`` (HF format, float32), built once."""
    from services.generator.model import init_model

    return init_model(tmp_path_factory.mktemp("tiny-model") / "policy")
