"""Shared fixtures.  Integration tests get their own real nats-server on a free loopback port."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from services.sandbox.docker_backend import docker_problem
from tests import watchdog
from tests.required import unavailable
from tests.sglang_fixtures import (  # noqa: F401  (fixtures, used by name)
    sglang_python,
    sglang_second_server,
    sglang_server,
    sglang_server_factory,
)

if TYPE_CHECKING:
    from services.model.sft import WarmupConfig

TESTS = Path(__file__).resolve().parent
#: Each test folder's tier: ``unit`` starts no process and no server (tests/unit/conftest.py
#: refuses them), ``integration`` has NATS, Docker and SGLang.
TIERS = {"unit": "unit", "integration": "integration", "adversarial": "integration"}


#: Under ``pytest -n`` (``--dist loadgroup``), the tests that share a heavy session resource
#: run on one worker, one after another: one CPU SGLang server per run instead of one per
#: worker, and the sandbox tests (Docker) never contend with each other for the engine.
GROUPS: tuple[tuple[str, frozenset[str]], ...] = (
    ("sglang", frozenset({"sglang_python", "sglang_server_factory"})),
    ("docker", frozenset({"sandbox_image"})),
)
#: Files in a group by what they run rather than by a fixture (the compose stack's own image).
FILE_GROUPS: dict[str, str] = {"test_compose.py": "docker"}


def pytest_configure(config: pytest.Config) -> None:
    watchdog.install(config)


# First: pytest-xdist's worker reads the group markers in its own hook of the same name.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0]
        item.add_marker(TIERS.get(folder, "integration"))
        group = _group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


def _group(item: pytest.Item) -> str:
    """The first group whose fixtures ``item`` uses (directly or through its fixtures)."""
    used = set(getattr(item, "fixturenames", ()))
    by_fixture = next((name for name, fixtures in GROUPS if used & fixtures), "")
    return by_fixture or FILE_GROUPS.get(item.path.name, "")


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


def _cached_policy(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    warmup: str = "",
    config: WarmupConfig | None = None,
) -> Path:
    """A copy of the policy ``temper model init`` builds, warmed up on the ``warmup`` domain
    with ``config`` if one is named; built once per recipe and kept in the model cache
    (services/model/cache.py), so a session copies it instead of spending minutes."""
    import shutil

    from services.domains import load_registry
    from services.model.cache import BUILDERS, MODEL_ROOT, cached_model, recipe_key
    from services.model.sft import WarmupConfig, supervised_warmup
    from services.model.tiny import init_model

    sources = list(BUILDERS)
    if warmup:
        sources.append(MODEL_ROOT / "domains" / f"{warmup}.py")

    def build(path: Path) -> None:
        init_model(path, force=True)
        if warmup:
            domain = load_registry(None).get(warmup)
            supervised_warmup(path, domain, config or WarmupConfig())

    recipe = [warmup, repr(config)] if warmup else []
    cached = cached_model(name, recipe_key(recipe, sources), build)
    policy = tmp_path_factory.mktemp(name) / "policy"
    shutil.copytree(cached, policy)
    return policy


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 policy of ``temper model init`` (HF format, float32)."""
    return _cached_policy(tmp_path_factory, "test-tiny-policy")


@pytest.fixture
def structlog_defaults() -> Iterator[None]:
    """structlog as it is out of the box for one test (every event printed to stdout, no
    level filter, no cached logger), the worker's configuration restored after: a test that
    reads log lines must not depend on what another test of its worker configured."""
    import structlog

    saved = structlog.get_config()
    structlog.reset_defaults()
    yield
    structlog.configure(**saved)


@pytest.fixture(scope="session")
def calling_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scheduling benchmark's policy (bench/bench_scheduling.py, in the model cache):
    warmed up on prompts holding earlier calls and their outputs with a call as the
    reference, it calls a tool again after each output (several turns of tool calls, which
    preemption at a later turn boundary needs)."""
    import shutil

    from tests.benches import load_bench

    policy = tmp_path_factory.mktemp("calling-policy") / "policy"
    shutil.copytree(load_bench("bench_scheduling").warmed_policy(), policy)
    return policy


@pytest.fixture(scope="session")
def tool_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny policy after a short supervised warm-up on tool_use's reference answers:
    it then writes ``<tool_call>`` blocks (a random one would never call a tool)."""
    from services.model.sft import WarmupConfig

    warmup = WarmupConfig(steps=80, lr=3e-3, examples=512)
    return _cached_policy(tmp_path_factory, "test-tool-policy", "tool_use", warmup)
