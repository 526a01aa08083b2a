"""Docker backend: a warm pool of locked-down containers, each running the agent.

Each container: no network, read-only root, a size-capped tmpfs work directory,
memory (= memory+swap), pids and CPU limits, every capability dropped,
no-new-privileges, a non-root user, the agent as its init (PID 1), a nofile ulimit.
The pool talks to the agent over a unix socket in a bind-mounted directory.  Containers
carry the owner's host and pid in a label, so a restarted service reaps what a
crashed one left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

import aiodocker
import aiodocker.exceptions
from aiodocker.containers import DockerContainer

from protocol.messages import SandboxStatus
from services.runtime.tasks import run_to_end
from services.sandbox import cgroups
from services.sandbox.agent_client import AgentError, ExecRequest
from services.sandbox.agent_socket import check_socket_path, give_to_user, take_back, wait_for_agent
from services.sandbox.backend import Box, Outcome, SandboxUnavailable, agent_status
from services.sandbox.docker_engine import ImageMissing, owner, pid_alive
from services.sandbox.docker_engine import docker_problem as docker_problem
from services.sandbox.docker_engine import docker_ready as docker_ready
from services.sandbox.images import (
    ImageRefused,
    TaskImage,
    image_refusal,
    seed_archive,
    task_image_config,
)
from services.sandbox.limits import container_shape
from services.sandbox.pool import WarmPool, failed
from services.sandbox.settings import Limits, SandboxSettings

LABEL = "temper.sandbox"
OWNER_LABEL = "temper.sandbox.owner"
SOCKET_DIR_IN_CONTAINER = "/run/temper"
SOCKET_NAME = "agent.sock"
#: Task images whose work-directory archive is kept (each at most 40 MiB, most tiny).
SEEDS_KEPT = 32


class DockerBackend(WarmPool):
    name = "docker"

    def __init__(self, settings: SandboxSettings) -> None:
        super().__init__(settings)
        self._docker: aiodocker.Docker | None = None
        #: Each container's cgroup counters when last read, and where they are read.
        self._counters: dict[str, cgroups.Counters] = {}
        self._sources: dict[str, cgroups.Sources] = {}
        #: Each task image's work-directory archive, by image id.
        self._seeds: dict[str, bytes] = {}

    @property
    def docker(self) -> aiodocker.Docker:
        if self._docker is None:
            raise SandboxUnavailable("docker backend not started")
        return self._docker

    async def start(self) -> None:
        self._docker = aiodocker.Docker(url=self.settings.docker_url or None)
        try:
            await self._docker.images.inspect(self.settings.image)
        except aiodocker.exceptions.DockerError as error:
            await self._docker.close()
            self._docker = None
            if error.status == 404:
                raise ImageMissing(self.settings.image) from None
            raise
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        await self.reap_orphans()

    async def reap_orphans(self) -> int:
        """Remove containers whose owning process (on this host) is gone."""
        host = socket.gethostname()
        reaped = 0
        for container in await self.docker.containers.list(all=True, filters={"label": [LABEL]}):
            owner = container._container.get("Labels", {}).get(OWNER_LABEL, "")
            owner_host, _, pid = owner.rpartition(":")
            if owner_host == host and pid.isdigit() and not pid_alive(int(pid)):
                name = container._container.get("Names", [""])[0].lstrip("/")
                await self._remove(container.id, name)
                reaped += 1
        if reaped:
            self._log.info("reaped_orphans", count=reaped)
        return reaped

    async def close(self) -> None:
        await super().close()
        if self._docker is not None:
            await self._docker.close()
            self._docker = None

    async def execute(
        self, box: Box, request: ExecRequest, limits: Limits, *, last: bool = False
    ) -> Outcome:
        try:
            reply = await self._run_agent(box, request, limits, last)
        except AgentError as error:
            return await self._agent_lost(box, request, error)
        if isinstance(reply, Outcome):
            return reply
        status = agent_status(reply)
        # Only a kill or a failure can be the OOM killer's doing: the cgroup is read for
        # those now, for the others once the reply is out (at release; see _inspect).
        if status in _MAYBE_OOM and self._news(box).oom_kills:
            status = SandboxStatus.OOM
        if status in _SPOILING:
            box.spoiled = status.value
        return Outcome(reply=reply, status=status, error=reply.error)

    def _inspect(self, box: Box) -> None:
        self._news(box)

    def _news(self, box: Box) -> cgroups.Counters:
        """What the cgroup counted since it was last read; any OOM kill or pids-limit hit
        (of the run, or of a child it survived) spoils the container."""
        sources = self._sources.get(box.id)
        if sources is None:
            sources = self._sources[box.id] = cgroups.locate(box.id)
        now = sources.read()
        seen = self._counters.get(box.id, cgroups.Counters())
        self._counters[box.id] = now
        news = cgroups.Counters(
            oom_kills=now.oom_kills - seen.oom_kills,
            pids_max_hits=now.pids_max_hits - seen.pids_max_hits,
        )
        if box.spoiled is None and news.pids_max_hits:
            box.spoiled = "pids limit hit"
        elif box.spoiled is None and news.oom_kills:
            box.spoiled = "oom"
        return news

    async def _agent_lost(self, box: Box, request: ExecRequest, error: AgentError) -> Outcome:
        """The agent (PID 1) went away mid-exec: SIGTERM from the code, or the kernel (OOM)."""
        box.spoiled = "agent lost"
        if self._news(box).oom_kills:
            return failed(
                request, SandboxStatus.OOM, "out of memory; the sandbox agent was killed", 0.0
            )
        # Let the engine settle: a container being removed still reports Running for a moment.
        await asyncio.sleep(0.5)
        state = await self._state(box)
        if state is None or state.get("Status") in ("removing", "dead"):
            return failed(request, SandboxStatus.INFRA_ERROR, "the sandbox container vanished", 0.0)
        if state.get("Running"):
            return failed(request, SandboxStatus.KILLED, f"the sandbox agent died: {error}", 0.0)
        return failed(request, SandboxStatus.KILLED, "the sandbox agent (PID 1) exited", 0.0)

    async def _spawn(self, limits: Limits, user: str, image: TaskImage | None = None) -> Box:
        name = f"temper-sbx-{uuid.uuid4().hex[:12]}"
        socket_dir = self.settings.state_dir / name
        check_socket_path(socket_dir / SOCKET_NAME)
        socket_dir.mkdir(parents=True)
        give_to_user(socket_dir, user)
        config = self._config(limits, socket_dir, user)
        if image is not None:
            checker = user == self.settings.checker_user
            task_image_config(config, image, checker=checker, disk_mb=limits.disk_mb)
        container = await self._create_container(config, name)
        try:
            await container.start()
            agent = await wait_for_agent(socket_dir / SOCKET_NAME)
            take_back(socket_dir, user)
        except BaseException:
            await self._remove(container.id, name)
            raise
        shape = container_shape(limits, user, image.id if image is not None else "")
        return Box(id=container.id, agent=agent, shape=shape, extra={"name": name})

    async def task_image(self, name: str) -> TaskImage:
        try:
            info = await self.docker.images.inspect(name)
        except aiodocker.exceptions.DockerError as error:
            if error.status == 404:
                raise ImageRefused(f"image {name!r} is not in the sandbox's engine") from None
            raise SandboxUnavailable(f"cannot inspect image {name!r}: {error}") from None
        config = info.get("Config") or {}
        workdir = str(config.get("WorkingDir") or "").rstrip("/") or "/"
        refusal = image_refusal(name, config.get("Labels"), workdir)
        if refusal is not None:
            raise ImageRefused(refusal)
        image_id = str(info["Id"])
        seed = self._seeds.get(image_id)
        if seed is None:
            seed = await self._seed(image_id, workdir)
            if len(self._seeds) >= SEEDS_KEPT:
                self._seeds.pop(next(iter(self._seeds)))
            self._seeds[image_id] = seed
        return TaskImage(name=name, id=image_id, workdir=workdir, seed=seed)

    async def _seed(self, image_id: str, workdir: str) -> bytes:
        """The image's work-directory files, read from a container created (never
        started) from it: the tmpfs a session mounts there hides them."""
        name = f"temper-seed-{uuid.uuid4().hex[:12]}"
        labels = {LABEL: "1", OWNER_LABEL: owner()}
        config = {"Image": image_id, "Labels": labels, "NetworkDisabled": True}
        container = await self._create_container(config, name)
        try:
            raw = await container.get_archive(workdir)
        except aiodocker.exceptions.DockerError as error:
            if error.status == 404:
                return b""  # no such folder in the image: the work directory starts empty
            raise SandboxUnavailable(f"cannot read the image's {workdir}: {error}") from None
        finally:
            await self._remove(container.id, "")
        return seed_archive(raw, workdir)

    async def _create_container(self, config: dict[str, Any], name: str) -> DockerContainer:
        """Create a container; cancelled meanwhile (the service stopping), still remove it.

        The engine goes on creating a container whose request was abandoned, so the
        create is shielded and what it made is removed before the cancellation goes on.
        """
        creating = asyncio.ensure_future(self.docker.containers.create(config, name=name))
        try:
            return await asyncio.shield(creating)
        except asyncio.CancelledError:
            await self._remove_created(creating, name)
            raise

    async def _remove_created(self, creating: asyncio.Future[DockerContainer], name: str) -> None:
        try:
            container = await creating
        except aiodocker.exceptions.DockerError:
            return
        await self._remove(container.id, name)

    def _config(self, limits: Limits, socket_dir: Path, user: str) -> dict[str, Any]:
        memory = limits.memory_mb * 1024 * 1024
        # exec: compiled languages run what they build in /work; nosuid keeps setuid bits inert.
        tmpfs = f"rw,exec,nosuid,nodev,uid={user},gid={user},mode=0700"
        nofile = self.settings.nofile
        return {
            "Image": self.settings.image,
            "User": user,
            "Labels": {LABEL: "1", OWNER_LABEL: owner()},
            "NetworkDisabled": True,
            "HostConfig": {
                "NetworkMode": "none",
                # Its own IPC namespace: the agent's reset removes every SysV object in it.
                "IpcMode": "private",
                "ReadonlyRootfs": True,
                "Tmpfs": {"/work": f"{tmpfs},size={limits.disk_mb}m", "/tmp": f"{tmpfs},size=16m"},
                "Memory": memory,
                "MemorySwap": memory,
                "PidsLimit": limits.pids,
                "NanoCpus": int(limits.cpus * 1e9),
                "CapDrop": ["ALL"],
                "SecurityOpt": ["no-new-privileges"],
                # The agent is PID 1 itself, not docker-init: an init of the code's uid that
                # code could ptrace, and that reset spares, would let code outlive its task.
                "Init": False,
                "Ulimits": [{"Name": "nofile", "Soft": nofile, "Hard": nofile}],
                "Binds": [f"{socket_dir}:{SOCKET_DIR_IN_CONTAINER}"],
            },
        }

    async def _kill(self, box: Box) -> None:
        with contextlib.suppress(aiodocker.exceptions.DockerError):
            await self.docker.containers.container(box.id).kill()

    async def _state(self, box: Box) -> dict[str, Any] | None:
        """The container's State, or None when it no longer exists."""
        try:
            info = await self.docker.containers.container(box.id).show()
        except aiodocker.exceptions.DockerError as error:
            if error.status == 404:
                return None
            raise
        return dict(info.get("State", {}))

    async def _destroy(self, box: Box) -> None:
        self._counters.pop(box.id, None)
        self._sources.pop(box.id, None)
        await self._remove(box.id, str(box.extra.get("name", "")))

    async def _remove(self, container_id: str, name: str) -> None:
        await run_to_end(self._remove_now(container_id, name))

    async def _remove_now(self, container_id: str, name: str) -> None:
        with contextlib.suppress(aiodocker.exceptions.DockerError):
            await self.docker.containers.container(container_id).delete(force=True)
        if name:
            shutil.rmtree(self.settings.state_dir / name, ignore_errors=True)


_MAYBE_OOM = (SandboxStatus.KILLED, SandboxStatus.NONZERO_EXIT)
_SPOILING = (SandboxStatus.TIMEOUT, SandboxStatus.OOM)
