"""Local backend for machines without Docker: the same agent, under bubblewrap or bare.

``bwrap``: every namespace unshared (no network, own pids, mounts, IPC, UTS), the
agent as PID 1, only system directories visible read-only, a private work directory,
the agent's rlimits.  ``subprocess``: the agent as a plain child with rlimits; it can
read the host's files and reach its network: weak isolation, for development.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import uuid
from pathlib import Path

from protocol.messages import SandboxStatus
from services.runtime.procs import child_preexec
from services.sandbox import agent as agent_module
from services.sandbox.agent_client import AgentError, ExecRequest
from services.sandbox.agent_socket import check_socket_path, wait_for_agent
from services.sandbox.backend import Box, Outcome, SandboxUnavailable, agent_status
from services.sandbox.images import ImageRefused, TaskImage
from services.sandbox.limits import container_shape
from services.sandbox.pool import WarmPool, failed
from services.sandbox.settings import Limits, SandboxSettings

#: The agent's package directory: ``python3 <it>`` runs the agent.
AGENT_PATH = Path(agent_module.__file__).resolve().parent
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc/alternatives")
SYSTEM_PYTHON = "/usr/bin/python3"

WEAK_ISOLATION_WARNING = (
    "sandbox backend 'subprocess' gives WEAK ISOLATION: sandboxed code runs as this user, "
    "can read the host's files and reach its network. Use it for development only; "
    "use 'docker' (or 'bwrap') for untrusted code."
)


class LocalBackend(WarmPool):
    def __init__(self, settings: SandboxSettings) -> None:
        self.name = settings.backend
        super().__init__(settings)
        self._procs: dict[str, asyncio.subprocess.Process] = {}

    async def start(self) -> None:
        if self.name == "bwrap" and shutil.which("bwrap") is None:
            raise SandboxUnavailable(
                "bubblewrap (bwrap) is not installed; install it or use backend docker"
            )
        if self.name == "subprocess":
            self._log.warning("weak_isolation", message=WEAK_ISOLATION_WARNING)
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)

    async def execute(
        self, box: Box, request: ExecRequest, limits: Limits, *, last: bool = False
    ) -> Outcome:
        try:
            reply = await self._run_agent(box, request, limits, last)
        except AgentError as error:
            box.spoiled = "agent lost"
            return failed(request, SandboxStatus.KILLED, f"the sandbox agent died: {error}", 0.0)
        if isinstance(reply, Outcome):
            return reply
        status = agent_status(reply)
        if status is SandboxStatus.TIMEOUT:
            box.spoiled = status.value
        return Outcome(reply=reply, status=status, error=reply.error)

    async def task_image(self, name: str) -> TaskImage:
        raise ImageRefused(
            f"image {name!r}: the {self.name} backend runs no image, only the host's "
            "agent (a task image needs the docker backend)"
        )

    async def _spawn(self, limits: Limits, user: str, image: TaskImage | None = None) -> Box:
        """``user`` names the tier only: code runs as this process's uid (a checker's
        sandbox is still fresh, never one a candidate used).  No ``image``: task_image
        refuses every one."""
        name = uuid.uuid4().hex[:12]
        root = self.settings.state_dir / name
        (root / "work").mkdir(parents=True)
        (root / "sock").mkdir()
        socket_path = check_socket_path(root / "sock" / "agent.sock")
        argv = self._argv(root, limits)
        with (root / "agent.log").open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=child_preexec(),
            )
        try:
            agent = await wait_for_agent(socket_path, log=root / "agent.log")
        except BaseException:
            _kill_group(proc.pid)
            await proc.wait()
            shutil.rmtree(root, ignore_errors=True)
            raise
        self._procs[name] = proc
        return Box(id=name, agent=agent, shape=container_shape(limits, user), extra={"root": root})

    def _argv(self, root: Path, limits: Limits) -> list[str]:
        rlimits = [f"--memory-mb={limits.memory_mb}", f"--nofile={self.settings.nofile}"]
        if self.name == "subprocess":
            sock, work = root / "sock" / "agent.sock", root / "work"
            return [
                sys.executable,
                str(AGENT_PATH),
                "--socket",
                str(sock),
                "--workdir",
                str(work),
                *rlimits,
            ]
        python = SYSTEM_PYTHON if Path(SYSTEM_PYTHON).exists() else sys.executable
        binds: list[str] = []
        for directory in SYSTEM_DIRS:
            binds += ["--ro-bind-try", directory, directory]
        if not python.startswith("/usr/"):
            prefix = str(Path(python).resolve().parents[1])
            binds += ["--ro-bind", prefix, prefix]
        return [
            "bwrap",
            "--unshare-all",
            # The agent is the namespace's PID 1, as in a container: bwrap's own init
            # would run with the code's uid, dumpable, and outlive every reset.
            "--as-pid-1",
            "--die-with-parent",
            "--new-session",
            *binds,
            "--ro-bind",
            str(AGENT_PATH),
            "/opt/temper/agent",
            "--tmpfs",
            "/tmp",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--bind",
            str(root / "work"),
            "/work",
            "--bind",
            str(root / "sock"),
            "/run/temper",
            "--chdir",
            "/work",
            python,
            "/opt/temper/agent",
            "--socket",
            "/run/temper/agent.sock",
            "--workdir",
            "/work",
            "--container",
            # No cgroup of its own here: a nice value would rank runs below every
            # process of the host, not only below the agent.
            "--run-nice",
            "0",
            *rlimits,
        ]

    async def _destroy(self, box: Box) -> None:
        proc = self._procs.pop(box.id, None)
        if proc is not None:
            _kill_group(proc.pid)
            await proc.wait()
        root = box.extra.get("root")
        if isinstance(root, Path):
            shutil.rmtree(root, ignore_errors=True)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
