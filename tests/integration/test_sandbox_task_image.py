"""Sandbox sessions on a Harbor task's image (``SandboxOpen.image``), through NATS, on the
real Docker engine: the image's work directory and files, the same hardening as the
configured image, checker sessions with Harbor's verifier folders, and the images refused.

Skips without Docker, unless CI=true or TEMPER_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiodocker
import pytest
from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.errors import ErrorCode
from protocol.messages import (
    ErrorReply,
    SandboxClose,
    SandboxLimits,
    SandboxOpen,
    SandboxSession,
    SandboxSnapshot,
    SandboxSnapshotRequest,
)
from services.domains.harbor import load_task
from services.domains.harbor_image import ensure_image
from services.sandbox.docker_backend import LABEL
from services.sandbox.service import SandboxService
from tests.integration.support import client
from tests.integration.test_sandbox_service import (
    ask,
    open_session,
    session_run,
    settings,
    wait_warm,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"
#: Files of every kind the image's work directory may hold, an ENTRYPOINT and a CMD the
#: sandbox must not run, and a WORKDIR that is not /work.
DOCKERFILE = """FROM temper-sandbox:latest
USER root
RUN mkdir -p /srv/task/sub && echo hello > /srv/task/sub/data.txt \\
    && ln /srv/task/sub/data.txt /srv/task/same.txt && ln -s sub/data.txt /srv/task/latest \\
    && printf '#!/bin/sh\\necho ran\\n' > /srv/task/run.sh && chmod 755 /srv/task/run.sh \\
    && chown -R 10001:10001 /srv/task
USER 10001
WORKDIR /srv/task
ENTRYPOINT ["/bin/false"]
CMD ["never"]
"""


@pytest.fixture(scope="module")
def task_images(tmp_path_factory: pytest.TempPathFactory, sandbox_image: str) -> list[str]:
    """Two task images: the fix-word-count fixture's (WORKDIR /app), and one of every kind
    of file under /srv/task.  Their tags are content hashes: built once, kept."""
    folder = tmp_path_factory.mktemp("task") / "kinds"
    shutil.copytree(FIXTURES / "fix-word-count", folder)
    (folder / "environment" / "Dockerfile").write_text(DOCKERFILE)
    return [ensure_image(load_task(path)).tag for path in (FIXTURES / "fix-word-count", folder)]


@pytest.fixture
async def sandbox(
    nats_url: str, tmp_path: Path, sandbox_image: str
) -> AsyncIterator[tuple[SandboxService, NATS]]:
    service = SandboxService(settings(nats_url, tmp_path, "docker", sandbox_image))
    async with service, client(nats_url) as nc:
        await wait_warm(service, 2)
        yield service, nc


async def containers_of(image_id: str) -> list[dict[str, object]]:
    """The inspected sandbox containers running ``image_id``."""
    async with aiodocker.Docker() as docker:
        found = await docker.containers.list(filters={"ancestor": [image_id], "label": [LABEL]})
        return [await docker.containers.container(c.id).show() for c in found]


async def test_a_session_runs_in_the_image_with_its_workdir_files_and_hardening(
    sandbox: tuple[SandboxService, NATS], task_images: list[str]
) -> None:
    service, nc = sandbox
    fixture, kinds = task_images
    opened = await open_session(
        nc, image=kinds, language="bash", limits=SandboxLimits(memory_mb=96, disk_mb=8)
    )
    seen = await session_run(
        nc,
        opened,
        "pwd; id -u; ./run.sh; cat same.txt latest; readlink latest; stat -c %a run.sh; "
        "ls /sys/class/net; touch /etc/x 2>/dev/null || echo read-only; "
        "test -e /tests || echo no-tests; test -e /logs || echo no-logs; echo $HOME",
    )
    assert seen.split("\n")[:-1] == [
        "/srv/task", "10001", "ran", "hello", "hello", "sub/data.txt", "755", "lo",
        "read-only", "no-tests", "no-logs", "/srv/task",
    ]  # fmt: skip
    image_id = await _image_id(kinds)
    [info] = await containers_of(image_id)
    host = info["HostConfig"]
    assert isinstance(host, dict)
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and host["Memory"] == 96 * 1024 * 1024
    assert set(host["Tmpfs"]) == {"/srv/task", "/tmp"} and "size=8m" in host["Tmpfs"]["/srv/task"]
    config = info["Config"]
    assert isinstance(config, dict) and config["User"] == "10001"
    await gone(nc, opened, image_id)
    # With the service's default limits too: cold, used once, never in the warm pool.
    word = await open_session(nc, image=fixture, language="bash")
    assert (await session_run(nc, word, "pwd; ls")).split() == ["/app", "wordcount.sh"]
    await gone(nc, word, await _image_id(fixture))
    assert service.backend.statistics()["pool_idle"] == 2


async def gone(nc: NATS, opened: SandboxSession, image_id: str) -> None:
    """Close the session: its container is removed, never reset for reuse."""
    await ask(nc, SandboxClose(session=opened.session), opened.subject)
    async with asyncio.timeout(30):
        while await containers_of(image_id):
            await asyncio.sleep(0.1)


async def _image_id(tag: str) -> str:
    async with aiodocker.Docker() as docker:
        return str((await docker.images.inspect(tag))["Id"])


async def test_a_checker_session_on_the_image_restores_the_work_and_has_the_verifier_folders(
    sandbox: tuple[SandboxService, NATS], task_images: list[str]
) -> None:
    _, nc = sandbox
    image = task_images[0]
    policy = await open_session(nc, image=image, language="bash")
    await session_run(nc, policy, "rm wordcount.sh; echo done > answer.txt; mkdir -p d/e")
    saved = await ask(nc, SandboxSnapshotRequest(session=policy.session), policy.subject)
    assert isinstance(saved, SandboxSnapshot)
    checker = await open_session(
        nc, image=image, language="bash", snapshot=saved.snapshot, checker=True
    )
    seen = await session_run(
        nc,
        checker,
        "pwd; id -u; ls; cat answer.txt; mkdir -p /logs/verifier && echo 1 > "
        "/logs/verifier/reward.txt && echo logs; echo t > /tests/x && echo tests",
    )
    # The work left, not the image's files (wordcount.sh was removed); Harbor's folders.
    assert seen.split() == ["/app", "10002", "answer.txt", "d", "done", "logs", "tests"]
    fresh = await open_session(nc, image=image, language="bash", checker=True)
    assert (await session_run(nc, fresh, "ls; ls /logs /tests")).split() == [
        "wordcount.sh", "/logs:", "/tests:",
    ]  # fmt: skip


async def test_other_images_are_refused_naming_them(
    sandbox: tuple[SandboxService, NATS], sandbox_image: str
) -> None:
    _, nc = sandbox
    unlabelled = "temper-sandbox:latest" if sandbox_image != "temper-sandbox:latest" else ""
    names = ["temper-no-such-image:1", "temper-sandbox-base-missing", unlabelled]
    for name in filter(None, names):
        refused = await ask(nc, SandboxOpen(id="o", image=name), subjects.sandbox_session())
        assert isinstance(refused, ErrorReply), (name, refused)
        assert refused.code is ErrorCode.BAD_REQUEST and refused.field == "$.image"
        assert repr(name) in refused.message, refused.message
    # The configured image by name is the configured image: the warm pool serves it.
    same = await ask(nc, SandboxOpen(id="o", image=sandbox_image), subjects.sandbox_session())
    assert isinstance(same, SandboxSession)


async def test_a_backend_without_docker_refuses_every_task_image(
    nats_url: str, tmp_path: Path
) -> None:
    service = SandboxService(settings(nats_url, tmp_path, "subprocess", pool_size=1))
    async with service, client(nats_url) as nc:
        name = "temper-harbor:0123456789abcdef"
        refused = await ask(nc, SandboxOpen(id="o", image=name), subjects.sandbox_session())
    assert isinstance(refused, ErrorReply) and refused.field == "$.image", refused
    assert f"{name!r}: the subprocess backend runs no image" in refused.message
