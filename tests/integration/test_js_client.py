"""docs/protocol.md's JavaScript client, run by Node against a real stack.

The module is taken from the page itself (the ```js block that starts with
``// temper-client.mjs``), so what a reader copies is what ran here.  The driver beside
this file decodes every golden fixture with it and compares the result with the
fixture's ``.json``, then asks a validator for the served domains, submits an
arithmetic task twice with one dedup id, and waits for its scored rollouts produced by
a real generator (torch engine, tiny policy) and validator over a real nats-server.

npm packages are installed once into a cache outside the clone, keyed by a hash of
package.json and package-lock.json.  Without Node: skipped, but a failure in CI.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import streams, subjects
from protocol.client import TemperClient
from services.generator.service import GeneratorService
from services.generator.settings import GeneratorSettings
from services.runtime.jetstream import ensure_streams
from services.validator.service import ValidatorService
from services.validator.settings import ValidatorSettings
from tests.golden.make_fixtures import FIXTURES
from tests.integration.support import client, runtime
from tests.required import unavailable

HERE = Path(__file__).resolve().parent / "js"
DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
NPM_INPUTS = ("package.json", "package-lock.json")
REQUIRE_FLAG = "TEMPER_REQUIRE_NODE"
NPM_TIMEOUT_S = 600


def client_module() -> str:
    """The page's JavaScript client, exactly as printed there."""
    blocks = re.findall(r"^```js\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.M | re.S)
    found = [block for block in blocks if block.startswith("// temper-client.mjs")]
    assert len(found) == 1, "docs/protocol.md must hold one ```js block of temper-client.mjs"
    return found[0]


def npm_hash() -> str:
    digest = hashlib.sha256()
    for name in NPM_INPUTS:
        digest.update(name.encode() + b"\n" + (HERE / name).read_bytes())
    return digest.hexdigest()[:16]


def install(cache: Path) -> Path:
    """``npm ci`` into ``cache`` once per hash; returns its node_modules."""
    target = cache / f"js-client-{npm_hash()}"
    stamp = target / ".temper-build-complete"
    if stamp.exists():
        return target / "node_modules"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"{target.name}.lock").open("w") as lock:
        # One installer at a time per hash: parallel sessions share the cache.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            for name in NPM_INPUTS:
                shutil.copy(HERE / name, target / name)
            npm = ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"]
            done = subprocess.run(
                npm, cwd=target, capture_output=True, text=True, timeout=NPM_TIMEOUT_S
            )
            if done.returncode != 0:
                unavailable(
                    "npm packages", f"npm ci failed: {done.stderr[-600:]}", flag=REQUIRE_FLAG
                )
            stamp.touch()
    return target / "node_modules"


@pytest.fixture(scope="session")
def node_modules() -> Path:
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            unavailable("Node.js", f"`{tool}` is not on PATH (apt: nodejs npm)", flag=REQUIRE_FLAG)
    return install(Path(os.environ.get("TEMPER_CACHE", "/var/cache/temper")))


@pytest.fixture
def js_dir(tmp_path: Path, node_modules: Path) -> Iterator[Path]:
    folder = tmp_path / "js"
    folder.mkdir()
    (folder / "temper-client.mjs").write_text(client_module(), encoding="utf-8")
    shutil.copy(HERE / "driver.mjs", folder / "driver.mjs")
    shutil.copy(HERE / "package.json", folder / "package.json")
    (folder / "node_modules").symlink_to(node_modules, target_is_directory=True)
    yield folder


async def run_node(folder: Path, *args: str, timeout_s: float = 150.0) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        "node",
        "driver.mjs",
        *args,
        cwd=folder,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()[-4000:]
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def stack(url: str, model: Path) -> tuple[GeneratorService, ValidatorService]:
    generator = GeneratorService(
        GeneratorSettings(
            runtime=runtime(url, instance="gen-js"),
            model=model,
            tools="local",
            fetch_wait_s=0.2,
            max_concurrent_tasks=2,
            prefix_cache_mb=16,
        )
    )
    validator = ValidatorService(ValidatorSettings(runtime=runtime(url, instance="val-js")))
    return generator, validator


def test_the_page_holds_the_client_module() -> None:
    module = client_module()
    for name in ("packI32", "unpackI32", "packF32", "unpackF32", "submitTask", "waitScored"):
        assert f"export function {name}(" in module or f"export async function {name}(" in module
    # Bins arrive unaligned: the unpackers read through a DataView.
    assert "new DataView(bin.buffer, bin.byteOffset" in module


@pytest.mark.timeout(400)
async def test_javascript_client_against_a_real_stack(
    nats_url: str, tiny_model: Path, js_dir: Path
) -> None:
    async with client(nats_url) as nc:
        await ensure_streams(nc.jetstream(), streams.ALL)
    generator, validator = stack(nats_url, tiny_model)
    async with generator, validator:
        result = await run_node(js_dir, nats_url, str(FIXTURES))
        async with await TemperClient.connect(nats_url) as python:
            listing = await python.domains(["arithmetic"])

    assert result["fixtures"] == len(list(FIXTURES.glob("*.msgpack")))
    assert result["packed"] >= 10
    domain = result["domain"]
    assert domain["name"] == "arithmetic"
    assert domain["metadata_keys"] == ["answer"] == listing.domains[0].metadata_keys
    assert domain["example"]["metadata"]["answer"]
    first, again = result["first"], result["again"]
    assert first["stream"] == streams.task_stream_name(domain["tier"])
    assert (first["duplicate"], again["duplicate"]) == (False, True)
    assert again["seq"] == first["seq"] and first["msgId"].startswith("task:js-")
    scored = sorted(result["results"], key=lambda r: r["sample_index"])
    assert [r["sample_index"] for r in scored] == [0, 1]
    for item in scored:
        assert item["status"] == "scored", item
        assert item["completion"] >= 1 and len(item["logprobs"]) == item["completion"]
        assert all(value <= 0.0 for value in item["logprobs"])
    assert subjects.domains() == "temper.v1.domains"
