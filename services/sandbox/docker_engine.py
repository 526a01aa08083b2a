"""The Docker engine as the sandbox sees it: whether it answers, and who owns a container."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import aiodocker
import aiodocker.exceptions

from services.sandbox.settings import SandboxSettings


def docker_problem() -> str | None:
    """Why no Docker engine can be used from here (CLI missing, engine silent), or None."""
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


class ImageMissing(RuntimeError):
    def __init__(self, image: str) -> None:
        super().__init__(
            f"sandbox image {image!r} not found; build it with deploy/sandbox/build-offline.sh"
        )


def owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def docker_ready(settings: SandboxSettings) -> bool:
    """The engine answers and holds the sandbox image."""
    try:
        async with aiodocker.Docker(url=settings.docker_url or None) as docker:
            await docker.images.inspect(settings.image)
    except (aiodocker.exceptions.DockerError, OSError, ValueError):
        return False
    return True
