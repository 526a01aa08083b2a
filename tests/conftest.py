"""Shared fixtures.  Integration tests get their own real nats-server on a free loopback port."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from services.sandbox.docker_backend import docker_problem
from tests.required import unavailable
from tests.sglang_fixtures import (  # noqa: F401  (fixtures, used by name)
    sglang_python,
    sglang_second_server,
    sglang_server,
    sglang_server_factory,
)

TESTS = Path(__file__).resolve().parent
#: Each test folder's tier: ``unit`` starts no process and no server (tests/unit/conftest.py
#: refuses them), ``integration`` has NATS, Docker and SGLang.
TIERS = {"unit": "unit", "integration": "integration", "adversarial": "integration"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0]
        item.add_marker(TIERS.get(folder, "integration"))


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


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """The offline sandbox image (built once; cached by content hash outside the clone).

    Without a Docker engine: skip, unless CI=true or TEMPER_REQUIRE_DOCKER=1, where it fails.
    """
    problem = docker_problem()
    if problem is not None:
        unavailable("Docker", problem, flag="TEMPER_REQUIRE_DOCKER")
    started = time.monotonic()
    build = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )
    if build.returncode == PREREQUISITE_MISSING:
        reason = f"cannot build the sandbox image: {build.stderr.strip()[-300:]}"
        unavailable("Docker", reason, flag="TEMPER_REQUIRE_DOCKER")
    assert build.returncode == 0, f"build-offline.sh failed:\n{build.stderr[-4000:]}"
    tag = build.stdout.strip().splitlines()[-1]
    assert tag.startswith("temper-sandbox:"), build.stdout
    print(f"sandbox image {tag} ready in {time.monotonic() - started:.1f}s")
    return tag


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 policy of ``temper model init`` (HF format, float32), built once."""
    from services.model.tiny import init_model

    return init_model(tmp_path_factory.mktemp("tiny-model") / "policy")


@pytest.fixture(scope="session")
def tool_policy(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """The tiny policy after a short supervised warm-up on tool_use's reference answers:
    it then writes ``<tool_call>`` blocks (a random one would never call a tool)."""
    import shutil

    from services.domains import load_registry
    from services.model.sft import WarmupConfig, supervised_warmup

    policy = tmp_path_factory.mktemp("tool-policy") / "policy"
    shutil.copytree(tiny_model, policy)
    domain = load_registry(None).get("tool_use")
    supervised_warmup(policy, domain, WarmupConfig(steps=80, lr=3e-3, examples=512))
    return policy
