"""Hostile code through the real sandbox service (Docker backend, over NATS).

Each test asserts containment, checked from the host where it can be (the host's
process table and cgroup counters, its files and disk, a loopback listener), with the
typed status the code earned (never ``infra_error`` for the code's own fault), and
then that the pool recovers: a trivial exec right afterwards is ok, the pool is back to
its warm size, and every container holds only the agent and its helpers again.

Network traffic stays on loopback: public IP literals are only connect targets from
inside ``--network none`` containers, where no packet can leave.  Docker tests skip
without an engine, unless TEMPER_REQUIRE_DOCKER=1 (CI), where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiodocker
import pytest
from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.messages import SandboxExec, SandboxLimits, SandboxResult, SandboxStatus
from services.runtime.settings import RuntimeSettings
from services.sandbox.backend import Box
from services.sandbox.docker_backend import LABEL, OWNER_LABEL, DockerBackend
from services.sandbox.service import SandboxService
from services.sandbox.settings import Limits, SandboxSettings
from tests.conftest import REPO
from tests.integration.support import client
from tests.integration.test_sandbox_agent import MEMORY_SCAN

S = SandboxStatus
RESULTS: Codec[SandboxResult] = Codec(SandboxResult)
SANDBOX_UID = 10001
MEMORY_MB = 128
PIDS = 64
DISK_MB = 16
OUTPUT_BYTES = 65536
DEFAULTS = Limits(
    timeout_s=3.0, memory_mb=MEMORY_MB, pids=PIDS, output_bytes=OUTPUT_BYTES, disk_mb=DISK_MB
)
#: A container at rest: the agent (its PID 1), the agent's zygote and the two spares that
#: the next runs will be (a run in progress: the agent, the zygote, the run and the spare
#: waiting behind it).
AT_REST = 4
OWNER = f"{socket.gethostname()}:{os.getpid()}"
CGROUP = Path("/sys/fs/cgroup")


# --------------------------------------------------------------------------- host-side views


def _cgroup_dirs(container_id: str, controller: str) -> list[Path]:
    return [
        CGROUP / controller / "docker" / container_id,  # v1, cgroupfs driver
        CGROUP / controller / "system.slice" / f"docker-{container_id}.scope",  # v1, systemd
        CGROUP / "docker" / container_id,  # v2
        CGROUP / "system.slice" / f"docker-{container_id}.scope",  # v2, systemd
    ]


def cgroup_read(container_id: str, controller: str, name: str) -> str | None:
    for directory in _cgroup_dirs(container_id, controller):
        with contextlib.suppress(OSError):
            return (directory / name).read_text()
    return None


def cgroup_pids(container_id: str) -> list[int]:
    text = cgroup_read(container_id, "pids", "cgroup.procs") or ""
    return [int(line) for line in text.split()]


def memory_peak(container_id: str) -> int:
    for name in ("memory.max_usage_in_bytes", "memory.peak"):  # v1, v2
        text = cgroup_read(container_id, "memory", name)
        if text is not None:
            return int(text)
    return 0


def _uids(pid: int) -> tuple[int, ...] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone meanwhile
        return None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return tuple(int(v) for v in line.split()[1:])
    return None


def _command(pid: int) -> str:
    """A process's name and command line; empty once it is gone."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return ""
    return f"{comm}: {cmdline.decode(errors='replace').strip()}"


def root_processes(pids: list[int]) -> set[tuple[int, str]]:
    """(pid, command) of those running as root, but for runc setting the container up."""
    found = {(pid, _command(pid)) for pid in pids if 0 in (_uids(pid) or ())}
    return {(pid, cmd) for pid, cmd in found if cmd and "runc" not in cmd}


def escaped_processes() -> list[int]:
    """Host processes of the sandbox user that live in no container's cgroup."""
    escaped = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or (_uids(int(name)) or (0,))[0] != SANDBOX_UID:
            continue
        try:
            cgroups = Path(f"/proc/{name}/cgroup").read_text()
        except OSError:
            continue
        if "docker" not in cgroups:
            escaped.append(int(name))
    return escaped


def interfaces_of(pid: int) -> list[str]:
    """Network interfaces of a host process's network namespace."""
    devices = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return [line.split(":")[0].strip() for line in devices]


# --------------------------------------------------------------------------- the pool under test


@dataclass
class Watch:
    """What a sampler saw from the host while hostile code ran."""

    containers_max: int = 0
    pids_max: dict[str, int] = field(default_factory=dict)
    memory_max: dict[str, int] = field(default_factory=dict)
    root_processes: set[tuple[int, str]] = field(default_factory=set)
    escaped: set[int] = field(default_factory=set)
    samples: int = 0


@dataclass
class Pool:
    service: SandboxService
    nc: NATS
    docker: aiodocker.Docker
    size: int
    state_dir: Path

    @property
    def backend(self) -> DockerBackend:
        backend = self.service.backend
        assert isinstance(backend, DockerBackend)
        return backend

    def boxes(self) -> list[Box]:
        return list(self.backend._boxes.values())

    def stat(self, name: str) -> float:
        return self.backend.statistics()[name]

    async def request(self, code: str, language: str, limits: SandboxLimits) -> bytes:
        message = SandboxExec(id="hostile", language=language, code=code, limits=limits)
        async with asyncio.timeout(60):
            reply = await self.nc.request(subjects.sandbox_exec(), encode(message), timeout=60)
        return bytes(reply.data)

    async def run(self, code: str, language: str = "python", **limits: Any) -> SandboxResult:
        return RESULTS.decode(await self.request(code, language, SandboxLimits(**limits)))

    async def containers(self) -> list[str]:
        """Ids of this test process's sandbox containers, in any state."""
        found = await self.docker.containers.list(
            all=True, filters={"label": [f"{OWNER_LABEL}={OWNER}"]}
        )
        return [c.id for c in found]

    async def host_disk_written(self, box: Box) -> dict[str, object]:
        """What a container has put on the host's disk: its writable layer, its socket dir."""
        info = await self.docker.containers.container(box.id).show(size=True)
        socket_dir = self.state_dir / str(box.extra["name"])
        return {"layer": info["SizeRw"], "socket dir": sorted(p.name for p in socket_dir.iterdir())}

    async def wait_warm(self, timeout_s: float = 30) -> None:
        async with asyncio.timeout(timeout_s):
            while (self.stat("pool_idle"), self.stat("sandboxes")) != (self.size, self.size):
                await asyncio.sleep(0.02)

    async def wait_at_rest(self, timeout_s: float = 10) -> None:
        """Every container holds only the agent and its helpers (killed processes are reaped)."""
        async with asyncio.timeout(timeout_s):
            while any(len(cgroup_pids(box.id)) != AT_REST for box in self.boxes()):
                await asyncio.sleep(0.02)

    async def assert_recovered(self) -> None:
        """A trivial exec is ok at once, then the pool is back to its warm size, at rest."""
        fine = await self.run("print('fine')")
        assert (fine.status, fine.stdout) == (S.OK, "fine\n"), fine
        await self.wait_warm()
        await self.wait_at_rest()
        assert sorted(await self.containers()) == sorted(box.id for box in self.boxes())
        assert escaped_processes() == []

    @contextlib.asynccontextmanager
    async def watching(self, interval_s: float = 0.02) -> AsyncIterator[Watch]:
        """Sample the host's view of this pool's containers while the block runs."""
        watch = Watch()
        # One sample before and one after, whatever the load: a run can end before a
        # loaded engine answers the first listing.
        await self._sample(watch)
        async with asyncio.TaskGroup() as group:
            sampler = group.create_task(self._keep_sampling(watch, interval_s))
            try:
                yield watch
            finally:
                sampler.cancel()
        await self._sample(watch)

    async def _keep_sampling(self, watch: Watch, interval_s: float) -> None:
        while True:
            await self._sample(watch)
            await asyncio.sleep(interval_s)

    async def _sample(self, watch: Watch) -> None:
        ids = await self.containers()
        ready = {box.id for box in self.boxes()}  # set up: their agent answered
        watch.containers_max = max(watch.containers_max, len(ids))
        for cid in ids:
            pids = cgroup_pids(cid)
            watch.pids_max[cid] = max(watch.pids_max.get(cid, 0), len(pids))
            watch.memory_max[cid] = max(watch.memory_max.get(cid, 0), memory_peak(cid))
            if cid in ready:
                watch.root_processes.update(root_processes(pids))
        watch.escaped.update(escaped_processes())
        watch.samples += 1


def pool_settings(url: str, tmp_path: Path, image: str, **overrides: Any) -> SandboxSettings:
    values: dict[str, Any] = {
        "runtime": RuntimeSettings(nats_url=url, heartbeat_s=0.2, grace_s=5, instance="sbx-sec"),
        "backend": "docker",
        "image": image,
        "pool_size": 2,
        # AF_UNIX paths are short: keep the sockets out of pytest's long tmp paths.
        "state_dir": Path(tempfile.mkdtemp(prefix="tsbsec-")),
        "snapshot_dir": tmp_path / "snapshots",
        "defaults": DEFAULTS,
        "watchdog_grace_s": 1.0,
    }
    values.update(overrides)
    return SandboxSettings(**values)


@pytest.fixture
def open_pool(
    nats_url: str, tmp_path: Path, sandbox_image: str
) -> Callable[..., contextlib.AbstractAsyncContextManager[Pool]]:
    """Start a sandbox service; on the way out, check that it left nothing behind."""

    @contextlib.asynccontextmanager
    async def opener(**overrides: Any) -> AsyncIterator[Pool]:
        settings = pool_settings(nats_url, tmp_path, sandbox_image, **overrides)
        service = SandboxService(settings)
        try:
            async with aiodocker.Docker() as docker:
                async with service, client(nats_url) as nc:
                    pool = Pool(service, nc, docker, settings.pool_size, settings.state_dir)
                    await pool.wait_warm(timeout_s=60)
                    yield pool
                    assert not service.crashed.is_set()
                assert await pool.containers() == [], "containers left behind"
                assert list(settings.state_dir.iterdir()) == [], "socket directories left"
        finally:
            shutil.rmtree(settings.state_dir, ignore_errors=True)

    return opener


@pytest.fixture
async def pool(
    open_pool: Callable[..., contextlib.AbstractAsyncContextManager[Pool]],
) -> AsyncIterator[Pool]:
    async with open_pool() as opened:
        yield opened


@pytest.fixture
async def single(
    open_pool: Callable[..., contextlib.AbstractAsyncContextManager[Pool]],
) -> AsyncIterator[Pool]:
    """One warm container, so the next task lands in the container the hostile one used."""
    async with open_pool(pool_size=1) as opened:
        yield opened


def report(result: SandboxResult) -> dict[str, Any]:
    """The JSON object the hostile code printed last."""
    assert result.stdout.strip(), result
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


# --------------------------------------------------------------------------- fork bombs

PYTHON_FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""

C_FORK_BOMB = """
#include <unistd.h>
int main(void) { for (;;) fork(); }
"""

JS_FORK_BOMB = """
const { spawn } = require('child_process');
for (;;) {
    try { spawn(process.execPath, [__filename], { stdio: 'ignore' }); } catch (e) {}
}
"""


@pytest.mark.parametrize(
    ("language", "code", "statuses"),
    [
        # Every copy keeps forking: the pids limit stops it, the wall clock ends it.
        ("python", PYTHON_FORK_BOMB, {S.TIMEOUT}),
        # The main shell returns at once (exit 0) while its background copies hit the
        # pids limit; the agent kills the whole group when the main process is done.
        ("bash", ":(){ :|:& };:", {S.OK, S.NONZERO_EXIT, S.TIMEOUT}),
        ("c", C_FORK_BOMB, {S.TIMEOUT}),
        # Every node copy spawns more until the pids limit (or memory: a node is large).
        ("js", JS_FORK_BOMB, {S.TIMEOUT, S.OOM}),
    ],
    ids=["python", "bash", "c", "js"],
)
async def test_fork_bomb_is_capped_by_the_pids_limit(
    pool: Pool, language: str, code: str, statuses: set[SandboxStatus]
) -> None:
    recycled = pool.stat("sandboxes_recycled")
    async with pool.watching() as watch:
        # The pool's shape, not the language's defaults: the bomb lands in a warm container.
        bomb = await pool.run(code, language, timeout_s=2, pids=PIDS, memory_mb=MEMORY_MB)
    assert bomb.status in statuses, bomb
    assert bomb.status is not S.INFRA_ERROR
    assert max(watch.pids_max.values()) <= PIDS  # the host never saw more in one container
    assert watch.escaped == set() and watch.root_processes == set()
    assert watch.containers_max <= pool.size
    await pool.assert_recovered()
    # The container that hit its pids limit was replaced, not reused.
    assert pool.stat("sandboxes_recycled") >= recycled + 1


# --------------------------------------------------------------------------- memory bombs


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("python", "x = bytearray(1 << 30)"),
        ("bash", "python3 -c 'x = bytearray(1 << 30)'"),
        (
            "python",
            "import subprocess\n"
            "subprocess.run(['python3', '-c', 'x = bytearray(1 << 30)'], check=True)",
        ),
    ],
    ids=["main-process", "bash-child", "python-subprocess"],
)
async def test_memory_bomb_is_an_oom(pool: Pool, language: str, code: str) -> None:
    # 1 GiB asked for, 128 MiB allowed.  In an exec child, Docker's State.OOMKilled stays
    # false: the status comes from the cgroup's oom_kill counter.
    async with pool.watching() as watch:
        hog = await pool.run(code, language)
    assert hog.status is S.OOM, hog
    assert 0 < max(watch.memory_max.values()) <= MEMORY_MB << 20  # the host's memory: untouched
    assert watch.containers_max <= pool.size
    await pool.assert_recovered()


async def test_stopping_while_a_spoiled_sandbox_is_removed_leaves_nothing(
    open_pool: Callable[..., contextlib.AbstractAsyncContextManager[Pool]],
) -> None:
    # The service stops the moment the reply is in, while the OOM-spoiled container is
    # still being removed: that removal runs to its end (open_pool checks that no
    # container and no socket directory is left).
    async with open_pool() as pool:
        hog = await pool.run("x = bytearray(1 << 30)")
        assert hog.status is S.OOM, hog
        assert pool.stat("sandboxes_recycled") == 0  # the removal is still under way


# --------------------------------------------------------------------------- disk


async def test_filling_the_workdir_stops_at_its_tmpfs_size(single: Pool) -> None:
    box = single.boxes()[0]
    fill = await single.run("df -k /work >&2; dd if=/dev/zero of=big bs=1M", "bash")
    assert fill.status is S.NONZERO_EXIT, fill
    assert "No space left on device" in fill.stderr
    df = fill.stderr.splitlines()[1].split()
    assert (df[0], df[1], df[-1]) == ("tmpfs", str(DISK_MB * 1024), "/work")  # memory, not disk
    assert f"{DISK_MB}+0 records in" in fill.stderr  # it got its 16 MiB, no more
    assert await single.host_disk_written(box) == {"layer": 0, "socket dir": ["agent.sock"]}
    # The next task gets the same container with an empty workdir and all its space.
    again = await single.run(
        "import os, json; s = os.statvfs('.')\n"
        "print(json.dumps({'files': os.listdir('.'), 'free': s.f_bfree == s.f_blocks}))"
    )
    assert report(again) == {"files": [], "free": True}
    assert single.boxes() == [box]
    await single.assert_recovered()


# --------------------------------------------------------------------------- time


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("python", "while True: pass"),
        ("bash", "while :; do :; done"),
        ("python", "import time\ntime.sleep(3600)"),
    ],
    ids=["python-busy", "bash-busy", "sleep"],
)
async def test_infinite_loop_times_out(pool: Pool, language: str, code: str) -> None:
    loop = await pool.run(code, language, timeout_s=1)
    assert loop.status is S.TIMEOUT, loop
    # Its limit, no more: the agent's own deadline, or on a starved machine the outer
    # watchdog's (which reports its own deadline as the run time).
    assert 1.0 <= loop.duration_s <= 1.0 + pool.service.settings.watchdog_grace_s
    await pool.assert_recovered()


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("python", "import subprocess\nsubprocess.Popen(['sleep', '60'])\nprint('bye')"),
        (
            "python",
            "import subprocess\n"
            "subprocess.Popen(['sleep', '60'], start_new_session=True)\nprint('bye')",
        ),
        ("bash", "sleep 60 &\necho bye"),
        # Leaves the group and lets go of the pipes: survives the exec, not the reset.
        ("bash", "setsid sleep 60 </dev/null >/dev/null 2>&1 &\necho bye"),
    ],
    ids=["python-child", "python-setsid", "bash-background", "bash-daemon"],
)
async def test_a_child_outliving_its_parent_does_not_hold_the_exec(
    single: Pool, language: str, code: str
) -> None:
    started = time.monotonic()
    result = await single.run(code, language, timeout_s=5)
    assert (result.status, result.stdout) == (S.OK, "bye\n"), result
    assert time.monotonic() - started < 1.0  # not the 60 s of the child, nor the timeout
    # The next task in the same container sees no process of the previous one.
    ps = await single.run("ps -eo pid=,comm=", "bash")
    assert "sleep" not in ps.stdout, ps.stdout
    # The agent, the zygote, bash (a spare), the spare waiting behind it and ps.
    assert len(ps.stdout.splitlines()) == AT_REST + 1
    await single.assert_recovered()


# --------------------------------------------------------------------------- output


@pytest.mark.parametrize(
    ("language", "code", "flooded"),
    [
        (
            "python",
            "import sys\nchunk = b'x' * (1 << 20)\n"
            "for _ in range(400):\n    sys.stdout.buffer.write(chunk)",
            "stdout",
        ),
        ("bash", "head -c 400000000 /dev/zero | tr '\\0' y >&2", "stderr"),
        ("bash", "yes out & yes err >&2", "both"),
    ],
    ids=["python-stdout", "bash-stderr", "both-streams"],
)
async def test_output_flood_is_cut_at_the_cap(
    pool: Pool, language: str, code: str, flooded: str
) -> None:
    started = time.monotonic()
    raw = await pool.request(code, language, SandboxLimits())
    result = RESULTS.decode(raw)
    assert result.status is S.OUTPUT_LIMIT, result
    assert time.monotonic() - started < 2.0
    assert len(raw) <= 2 * OUTPUT_BYTES + 4096  # hundreds of MB in, one bounded reply out
    if flooded in ("stdout", "both"):
        assert result.stdout_truncated or result.stderr_truncated
    if flooded == "stdout":
        assert result.stdout_truncated and len(result.stdout) == OUTPUT_BYTES
    if flooded == "stderr":
        assert result.stderr_truncated and len(result.stderr) == OUTPUT_BYTES
    assert len(result.stdout) <= OUTPUT_BYTES and len(result.stderr) <= OUTPUT_BYTES
    await pool.assert_recovered()


# --------------------------------------------------------------------------- network

NETWORK_PROBE = """
import errno, json, socket
out = {}
for host, port in [("1.1.1.1", 53), ("8.8.8.8", 443), ("127.0.0.1", PORT)]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((host, port))
        out[f"tcp {host}:{port}"] = "connected"
    except OSError as e:
        out[f"tcp {host}:{port}"] = errno.errorcode.get(e.errno, str(e))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("1.1.1.1", 53))
    out["udp 1.1.1.1:53"] = "sent"
except OSError as e:
    out["udp 1.1.1.1:53"] = errno.errorcode.get(e.errno, str(e))
out["interfaces"] = [name for _, name in socket.if_nameindex()]
out["routes"] = open("/proc/net/route").read().splitlines()[1:]
print(json.dumps(out))
"""


async def test_network_egress_goes_nowhere(pool: Pool) -> None:
    accepted: list[object] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer.get_extra_info("peername"))
        writer.close()

    listener = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    async with listener:
        probe = await pool.run(NETWORK_PROBE.replace("PORT", str(port)), timeout_s=5)
        await asyncio.sleep(0.2)
    assert probe.status is S.OK, probe
    seen = report(probe)
    assert seen["tcp 1.1.1.1:53"] == seen["tcp 8.8.8.8:443"] == "ENETUNREACH"
    assert seen["udp 1.1.1.1:53"] == "ENETUNREACH"
    # The container's 127.0.0.1 is its own: the host's listener is not reachable.
    assert seen[f"tcp 127.0.0.1:{port}"] == "ECONNREFUSED"
    assert accepted == []
    assert (seen["interfaces"], seen["routes"]) == (["lo"], [])
    # From the host: no network but the container's own loopback.
    for box in pool.boxes():
        info = await pool.docker.containers.container(box.id).show()
        assert info["HostConfig"]["NetworkMode"] == "none"
        assert set(info["NetworkSettings"]["Networks"]) <= {"none"}
        assert interfaces_of(info["State"]["Pid"]) == ["lo"]
    await pool.assert_recovered()


# --------------------------------------------------------------------------- host files

HOST_FILES_PROBE = """
import json, os
out = {}
for path in ["/etc/shadow", "/proc/1/environ"]:
    try:
        out[path] = open(path, "rb").read().decode(errors="replace")
    except OSError as e:
        out[path] = e.strerror
out["exists"] = {p: os.path.exists(p) for p in PATHS}
out["pid1"] = open("/proc/1/cmdline", "rb").read().replace(b"\\0", b" ").decode()
environ = b""
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        environ += open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        pass
out["environ"] = environ.decode(errors="replace")
print(json.dumps(out))
"""


async def test_host_files_are_not_visible(
    pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = secrets.token_hex(16)
    monkeypatch.setenv("TEMPER_TEST_SECRET", token)  # the service runs in this process
    marker = tmp_path / "host-marker"
    marker.write_text(token)
    paths = [
        str(REPO / "pyproject.toml"),
        str(marker),
        str(pool.state_dir),
        "/var/run/docker.sock",
        "/run/docker.sock",
        "/var/lib/docker",
    ]
    probe = await pool.run(HOST_FILES_PROBE.replace("PATHS", repr(paths)))
    assert probe.status is S.OK, probe
    seen = report(probe)
    assert seen["/etc/shadow"] == "Permission denied"  # and it is the image's, not the host's
    assert seen["exists"] == dict.fromkeys(paths, False)
    assert "/opt/temper/agent" in seen["pid1"]  # its own PID 1 (the agent), not the host's
    assert seen["/proc/1/environ"] == "Permission denied"  # the agent is not dumpable
    assert token not in probe.stdout
    await pool.assert_recovered()


# --------------------------------------------------------------------------- writing

WRITE_PROBE = """
import ctypes, errno, json, os
out = {}
for path in TARGETS:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        out[path] = "writable"
    except OSError as e:
        out[path] = errno.errorcode[e.errno]
mounts = {line.split()[4]: line.split()[5] for line in open("/proc/self/mountinfo")}
out["root options"] = mounts["/"].split(",")
def fill(path):
    fd, total = os.open(path, os.O_WRONLY | os.O_CREAT), 0
    try:
        while True:
            total += os.write(fd, bytes(1 << 20))
    except OSError as e:
        return [total >> 20, errno.errorcode[e.errno]]
out["/tmp fill"] = fill("/tmp/planted")
# What stays writable (all in memory, charged to the container) is planted for the
# next task: it must find nothing.
open("/dev/shm/planted", "w").write("x")
os.close(os.open("/dev/mqueue/planted", os.O_CREAT | os.O_RDWR, 0o600))
libc = ctypes.CDLL(None, use_errno=True)
out["sysv"] = [libc.shmget(0x7E57, 4096, 0o1600), libc.msgget(0x7E58, 0o1600),
               libc.semget(0x7E59, 1, 0o1600)]
print(json.dumps(out))
"""

LEFTOVERS_PROBE = """
import json, os
ipc = {k: open(f"/proc/sysvipc/{k}").read().splitlines()[1:] for k in ("shm", "msg", "sem")}
dirs = {d: os.listdir(d) for d in (".", "/tmp", "/dev/shm", "/dev/mqueue")}
print(json.dumps({"dirs": dirs, "ipc": ipc}))
"""


#: On the read-only root file system: new files and existing ones (root's, so some fail
#: the permission check first).
READ_ONLY = [
    "/planted",
    "/etc/planted",
    "/etc/passwd",
    "/usr/bin/planted",
    "/usr/bin/python3",
    "/opt/temper/agent/__main__.py",
    "/opt/temper/agent/seccomp.py",
    "/opt/temper/agent/planted",
    "/var/tmp/planted",
    "/home/planted",
]
#: Not the sandbox user's.  /run/temper is the host's socket directory, taken back once the
#: agent listens: left writable, code could fill the host's disk through it.
DENIED = ["/root/planted", "/run/temper/planted", "/sys/fs/cgroup/planted"]


async def test_writing_outside_the_workdir(single: Pool) -> None:
    box = single.boxes()[0]
    targets = [*READ_ONLY, *DENIED, "/proc/sys/kernel/hostname"]
    probe = await single.run(WRITE_PROBE.replace("TARGETS", repr(targets)))
    assert probe.status is S.OK, probe
    seen = report(probe)
    assert "ro" in seen["root options"]
    for path in READ_ONLY:
        assert seen[path] in ("EROFS", "EACCES"), path
    for path in DENIED:
        assert seen[path] == "EACCES", path
    assert seen["/proc/sys/kernel/hostname"] in ("EROFS", "EACCES")
    assert seen["/tmp fill"] == [16, "ENOSPC"]  # /tmp is a small tmpfs
    assert all(ident >= 0 for ident in seen["sysv"])
    assert await single.host_disk_written(box) == {"layer": 0, "socket dir": ["agent.sock"]}
    # The next task, in the same container, finds nothing of it.
    leftovers = await single.run(LEFTOVERS_PROBE)
    assert single.boxes() == [box]
    assert report(leftovers) == {
        "dirs": {".": [], "/tmp": [], "/dev/shm": [], "/dev/mqueue": []},
        "ipc": {"shm": [], "msg": [], "sem": []},
    }
    await single.assert_recovered()


# --------------------------------------------------------------------------- privileges

PRIVILEGE_PROBE = r"""
import ctypes, errno, json, os, shutil, socket, subprocess
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def run(*argv):
    p = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return [p.returncode, p.stdout + p.stderr]
def call(fn, *args):
    return "ok" if fn(*args) == 0 else errno.errorcode[ctypes.get_errno()]
found = run("find", "/", "-xdev", "-perm", "-4000", "-type", "f")[1].split()
out["setuid"] = sorted(found)
out["su"] = run("su", "-c", "id -u", "root")
out["passwd"] = run("passwd", "-d", "root")
out["mount"] = run("mount", "-t", "tmpfs", "none", "/work")
out["unshare -r"] = run("unshare", "-r", "id", "-u")
out["unshare -m"] = run("unshare", "-m", "true")
out["unshare(NEWUSER)"] = call(libc.unshare, 0x10000000)
out["unshare(NEWNS)"] = call(libc.unshare, 0x00020000)
for name, family, kind in [("raw", socket.AF_INET, socket.SOCK_RAW),
                           ("packet", socket.AF_PACKET, socket.SOCK_RAW)]:
    try:
        socket.socket(family, kind, socket.htons(3) if name == "packet" else 1).close()
        out[name] = "ok"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
agent = os.getppid()
out["agent pid"] = agent
# Every other process in the sandbox (the agent, its zygote, the spare waiting behind
# this run): no ptrace, no memory.
others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
out["others"] = len(others)
out["ptrace"] = sorted({call(libc.ptrace, 16, pid, None, None) for pid in others})
for what in ("mem", "environ"):
    seen = set()
    for pid in others:
        try:
            open(f"/proc/{pid}/{what}", "rb").read(1)
            seen.add("read")
        except OSError as e:
            seen.add(errno.errorcode[e.errno])
    out[what] = sorted(seen)
# A setuid bit set by the user: on a file it owns (chown to root is refused), on a
# nosuid tmpfs.
shutil.copy("/usr/bin/id", "id")
os.chmod("id", 0o4755)
try:
    os.chown("id", 0, 0)
    out["chown root"] = "ok"
except OSError as e:
    out["chown root"] = errno.errorcode[e.errno]
mounts = {line.split()[4]: line.split()[5] for line in open("/proc/self/mountinfo")}
out["work options"] = mounts["/work"].split(",")
status = dict(line.split(":\t", 1) for line in open("/proc/self/status") if ":\t" in line)
out["status"] = {k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs",
                                                "Seccomp", "Uid")}
print(json.dumps(out))
"""


async def test_privilege_escalation_fails(pool: Pool) -> None:
    async with pool.watching() as watch:
        probe = await pool.run(PRIVILEGE_PROBE, timeout_s=10)
    assert probe.status is S.OK, probe
    seen = report(probe)
    # The image has setuid-root binaries; no-new-privileges makes their bit inert.
    assert {"/usr/bin/su", "/usr/bin/passwd", "/usr/bin/mount"} <= set(seen["setuid"])
    for tool in ("su", "passwd", "mount", "unshare -r", "unshare -m"):
        code, output = seen[tool]
        assert code != 0, (tool, output)
    assert "0" not in seen["su"][1].split() and "0" not in seen["unshare -r"][1].split()
    assert seen["unshare(NEWUSER)"] == seen["unshare(NEWNS)"] == "EPERM"
    assert seen["raw"] == "EPERM"
    assert seen["packet"] in ("EPERM", "EAFNOSUPPORT")
    assert seen["agent pid"] == 1 and seen["others"] == 3  # agent, zygote, waiting spare
    assert seen["ptrace"] == ["EPERM"]
    assert seen["mem"] == seen["environ"] == ["EACCES"]
    assert seen["chown root"] == "EPERM"
    assert {"nosuid", "nodev"} <= set(seen["work options"])
    status = seen["status"]
    assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == "0" * 16
    assert (status["NoNewPrivs"], status["Seccomp"]) == ("1", "2")
    assert status["Uid"].split() == [str(SANDBOX_UID)] * 4
    assert watch.root_processes == set()  # the host never saw a root process in them
    await pool.assert_recovered()


PTRACE_PID1 = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(16, 1, None, None) == 0:  # PTRACE_ATTACH
    os.waitpid(1, 0x40000000)  # __WALL: the attach stop
    libc.ptrace(17, 1, None, None)  # PTRACE_DETACH
    print("attached")
else:
    print(errno.errorcode[ctypes.get_errno()])
"""


async def test_ptrace_of_pid_1_is_refused(pool: Pool) -> None:
    # PID 1 is the agent (no docker-init): not dumpable, and the agent's seccomp filter
    # refuses ptrace outright, so nothing planted there could outlive the reset.
    probe = await pool.run(PTRACE_PID1)
    assert probe.stdout == "EPERM\n", probe
    await pool.assert_recovered()


# --------------------------------------------------------------------------- killing


ALIVE = "time.sleep(0.2)\nprint('alive')"


@pytest.mark.parametrize(
    ("language", "code", "status"),
    [
        # The agent is PID 1: the kernel drops SIGKILL and SIGSTOP sent to a PID
        # namespace's init from inside it.
        ("python", f"import os, time\nos.kill(os.getppid(), 9)\n{ALIVE}", S.OK),
        ("bash", "kill -9 $PPID; kill -9 1; sleep 0.2; echo alive", S.OK),
        ("python", f"import os, time\nos.kill(1, 19)\n{ALIVE}", S.OK),
        # SIGTERM it takes as the order to shut down: the container goes.
        ("python", "import os, time\nos.kill(1, 15)\ntime.sleep(10)", S.KILLED),
    ],
    ids=["kill-agent", "bash-kill-agent", "stop-agent", "term-agent"],
)
async def test_killing_or_stopping_the_agent(
    pool: Pool, language: str, code: str, status: SandboxStatus
) -> None:
    before = set(await pool.containers())
    result = await pool.run(code, language, timeout_s=1)
    assert result.status is status, result
    await pool.assert_recovered()
    if status is S.OK:
        assert result.stdout == "alive\n"
        assert set(await pool.containers()) == before  # nothing to replace
    else:
        assert len(before - set(await pool.containers())) == 1


#: Signals every process of the sandbox but the agent and itself: the agent's zygote and
#: the spare waiting behind this run.
SIGNAL_THE_ZYGOTE = """
import os, signal
hit = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) not in (1, os.getpid()):
        try:
            os.kill(int(pid), SIGNAL)
        except ProcessLookupError:  # exited since /proc was listed: nothing left to hit
            continue
        hit += 1
print(hit)
"""


async def test_killing_or_stopping_the_zygote(single: Pool) -> None:
    box = single.boxes()[0]
    for sig in ("SIGSTOP", "SIGKILL"):
        hit = await single.run(SIGNAL_THE_ZYGOTE.replace("SIGNAL", f"signal.{sig}"))
        assert (hit.status, hit.stdout) == (S.OK, "2\n"), hit
        after = await single.run("print('next')")  # continued, or replaced
        assert (after.status, after.stdout) == (S.OK, "next\n"), after
    assert single.boxes() == [box]
    await single.assert_recovered()


@pytest.mark.parametrize(
    "code",
    [
        "chrt --idle -p 0 $(ps -o pid= --ppid 1 | head -n 1)",  # the zygote's policy
        "renice -n 5 -p 1",  # the agent
        "taskset -a -p 1 1",  # the agent's CPU affinity
    ],
    ids=["idle-zygote", "renice-agent", "taskset-agent"],
)
async def test_changing_the_agents_scheduling_gets_the_sandbox_replaced(
    single: Pool, code: str
) -> None:
    # Code shares the agent's uid: it can renice the agent or change its zygote's policy
    # (which every later run would inherit), which no process of that uid can undo.  The
    # reset notices.
    box = single.boxes()[0]
    result = await single.run(code, "bash")
    assert result.status is S.OK, result
    await single.wait_warm()
    assert single.boxes() != [box]
    niceness = await single.run("ps -o ni= -p 1; nice; chrt -p $$", "bash")
    assert niceness.stdout.split()[:2] == ["0", "19"], niceness
    assert "SCHED_OTHER" in niceness.stdout, niceness
    await single.assert_recovered()


async def test_runs_rank_below_the_agent_and_cannot_climb(single: Pool) -> None:
    # In its container a run is at nice 19, so that the agent preempts it at once; code
    # can neither lower that (no CAP_SYS_NICE, RLIMIT_NICE 0) nor raise the zygote.
    probe = (
        "ps -o ni= -p 1; nice; renice -n 0 -p $$ >/dev/null 2>&1 && echo lowered || echo refused"
    )
    result = await single.run(probe, "bash")
    assert result.stdout.split() == ["0", "19", "refused"], result
    await single.assert_recovered()


async def test_a_frozen_sandbox_is_killed_by_the_watchdog(pool: Pool) -> None:
    # Code cannot stop the agent any more: freeze its container from the host instead.
    before = set(await pool.containers())
    started = time.monotonic()
    pending = asyncio.ensure_future(pool.run("import time; time.sleep(30)", timeout_s=1))
    async with asyncio.timeout(10):
        while not (busy := [box for box in pool.boxes() if box.uses]):
            await asyncio.sleep(0.01)
    await pool.docker.containers.container(busy[0].id).pause()
    result = await pending
    assert (result.status, result.error) == (S.TIMEOUT, "killed by the outer watchdog"), result
    assert time.monotonic() - started < 1.0 + pool.service.settings.watchdog_grace_s + 2.0
    await pool.assert_recovered()
    assert busy[0].id not in await pool.containers()
    assert len(before - set(await pool.containers())) == 1


# --------------------------------------------------------------------------- zombies

ZOMBIES = """
import os, time
for _ in range(25):  # children that exit and are never waited for
    if os.fork() == 0:
        os._exit(0)
if os.fork() == 0:  # a stray that left the group, with zombies of its own
    os.setsid()
    for _ in range(15):
        if os.fork() == 0:
            os._exit(0)
    time.sleep(60)
time.sleep(0.3)
states = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        states.append(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0])
    except OSError:
        pass
print(states.count("Z"))
"""


async def test_zombies_do_not_accumulate(single: Pool) -> None:
    for _ in range(3):
        zombies = await single.run(ZOMBIES)
        assert zombies.status is S.OK, zombies
        assert int(zombies.stdout) >= 25  # they were there while the task ran
        await single.wait_warm()
        await single.wait_at_rest()  # init and agent only, from the host's side
        count = await single.run("import os; print(sum(p.isdigit() for p in os.listdir('/proc')))")
        # The agent, its zygote, this task and the spare waiting behind it.
        assert count.stdout == f"{AT_REST}\n"
    await single.assert_recovered()


# --------------------------------------------------------------------------- all at once

HOSTILE_MIX: list[tuple[str, str, set[SandboxStatus]]] = [
    ("python", PYTHON_FORK_BOMB, {S.TIMEOUT}),
    ("bash", ":(){ :|:& };:", {S.OK, S.NONZERO_EXIT, S.TIMEOUT}),
    ("python", "x = bytearray(1 << 30)", {S.OOM}),
    ("bash", "python3 -c 'x = bytearray(1 << 30)'", {S.OOM}),
    ("python", "while True: pass", {S.TIMEOUT}),
    ("bash", "head -c 400000000 /dev/zero", {S.OUTPUT_LIMIT}),
    ("bash", "dd if=/dev/zero of=big bs=1M", {S.NONZERO_EXIT}),
    ("python", "import os\nos.kill(1, 9)\nos.kill(1, 19)\nprint('alive')", {S.OK}),
    ("python", "import os, time\nos.kill(1, 15)\ntime.sleep(10)", {S.KILLED}),
    ("python", SIGNAL_THE_ZYGOTE.replace("SIGNAL", "signal.SIGKILL"), {S.OK}),
    ("bash", "setsid sleep 60 </dev/null >/dev/null 2>&1 &\necho bye", {S.OK}),
    ("python", ZOMBIES, {S.OK}),
    ("python", NETWORK_PROBE.replace("PORT", "9"), {S.OK}),
    ("python", "print('fine')", {S.OK}),
]


async def test_fifty_hostile_tasks_at_once(
    open_pool: Callable[..., contextlib.AbstractAsyncContextManager[Pool]],
) -> None:
    async with open_pool(pool_size=4, acquire_timeout_s=90) as pool:
        tasks = [HOSTILE_MIX[i % len(HOSTILE_MIX)] for i in range(50)]
        async with pool.watching(interval_s=0.05) as watch, asyncio.timeout(120):
            results = await asyncio.gather(
                *(pool.run(code, language, timeout_s=2) for language, code, _ in tasks)
            )
        for (language, code, statuses), result in zip(tasks, results, strict=True):
            assert result.status in statuses, (language, code[:40], result)
        assert watch.samples > 0
        assert watch.containers_max <= pool.size, watch.containers_max
        assert max(watch.pids_max.values()) <= PIDS
        assert watch.escaped == set() and watch.root_processes == set()
        await pool.assert_recovered()


# --------------------------------------------------------------------------- leftovers


async def test_stopping_mid_refill_leaves_no_container(
    nats_url: str,
    tmp_path: Path,
    sandbox_image: str,
) -> None:
    # Stop the service while its warm pool is still being created: containers whose
    # creation was under way must not appear afterwards.
    settings = pool_settings(nats_url, tmp_path, sandbox_image, pool_size=4)
    try:
        async with aiodocker.Docker() as docker:
            for delay_s in (0.0, 0.05, 0.2):
                async with SandboxService(settings):
                    await asyncio.sleep(delay_s)
                await asyncio.sleep(1.0)  # what an abandoned create would leave shows up by now
                left = await docker.containers.list(
                    all=True, filters={"label": [LABEL, f"{OWNER_LABEL}={OWNER}"]}
                )
                assert left == [], delay_s
                assert list(settings.state_dir.iterdir()) == []
    finally:
        shutil.rmtree(settings.state_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_stray_sandbox_process() -> Iterator[None]:
    yield
    assert escaped_processes() == []


async def test_a_task_cannot_read_the_previous_task_from_memory(single: Pool) -> None:
    # Runs are spares of a zygote that never read a request, not forks of the agent.
    secret = f"hidden-answer-{secrets.token_hex(8)}"
    program = f"answer = {secret!r}\n" + "# a program of a few kB\n" * 200
    first = await single.run(program)
    assert first.status is S.OK
    box = single.boxes()[0]
    head, tail = secret[:16], secret[16:]
    scan = await single.run(
        MEMORY_SCAN.replace("HEAD", repr(head[::-1])).replace("TAIL", repr(tail[::-1]))
    )
    assert single.boxes() == [box]  # the same container, reset in between
    assert scan.stdout == "0\n", scan
