"""The offline sandbox image, built by deploy/sandbox/build-offline.sh and run as the pool runs it.

One container, started by hand with the docker CLI (no network, read-only root, tmpfs
workdir, no capabilities, non-root, memory/pids limits, the socket's directory
bind-mounted), driven through AgentClient.  The first build takes a few minutes
(debootstrap); later runs reuse the cached tarball and image and take seconds.

Without a Docker engine these tests skip, unless TEMPER_REQUIRE_DOCKER=1 (CI), where
they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from protocol.messages import SandboxStatus
from services.sandbox.agent_client import AgentClient, AgentError, ExecReply, ExecRequest

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "deploy" / "sandbox" / "build-offline.sh"
#: build-offline.sh's exit status when docker, debootstrap or root is missing.
PREREQUISITE_MISSING = 3
BUILD_TIMEOUT_S = 1200
SANDBOX_UID = 10001
TEST_LABEL = "org.temper.test=sandbox-image"

#: How the pool runs a sandbox (the socket directory's bind mount is added per container);
#: no --init: the agent is the container's PID 1.
RUN_FLAGS = (
    "--network none --read-only --cap-drop ALL --security-opt no-new-privileges "
    f"--user {SANDBOX_UID} --memory 256m --memory-swap 256m --pids-limit 128 "
    f"--tmpfs /work:size=64m,exec,nosuid,nodev,uid={SANDBOX_UID} --label {TEST_LABEL}"
).split()

# The first test pays for the image build in its fixture setup.
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 120)


@dataclass(frozen=True)
class Sandbox:
    container_id: str
    socket: Path

    def logs(self) -> str:
        out = subprocess.run(
            ["docker", "logs", self.container_id], capture_output=True, text=True, timeout=30
        )
        return out.stdout + out.stderr


@pytest.fixture(scope="module")
def sandbox(sandbox_image: str) -> Iterator[Sandbox]:
    host_dir = Path(tempfile.mkdtemp(prefix="tsb-"))  # short: AF_UNIX paths are capped
    try:
        os.chown(host_dir, SANDBOX_UID, SANDBOX_UID)  # the agent (uid 10001) creates the socket
    except PermissionError:
        os.chmod(host_dir, 0o777)  # not root: a private /tmp dir open to the container's uid
    run = subprocess.run(
        ["docker", "run", "-d", *RUN_FLAGS, "-v", f"{host_dir}:/run/temper", sandbox_image],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    box = Sandbox(run.stdout.strip(), host_dir / "agent.sock")
    try:
        yield box
    finally:
        subprocess.run(["docker", "rm", "-f", box.container_id], capture_output=True, timeout=60)
        shutil.rmtree(host_dir, ignore_errors=True)


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[AgentClient]:
    try:
        c = await AgentClient.connect(sandbox.socket, timeout_s=60.0)
    except AgentError as exc:
        pytest.fail(f"{exc}\ncontainer logs:\n{sandbox.logs()}")
    try:
        yield c
    finally:
        await c.close()


async def run(client: AgentClient, **fields: object) -> ExecReply:
    fields.setdefault("id", "t")
    fields.setdefault("timeout_s", 10.0)
    return await client.exec(ExecRequest(**fields), timeout_s=30.0)  # type: ignore[arg-type]


PROCESS_LIST = (
    "import json, os\n"
    "procs = {}\n"
    "for p in os.listdir('/proc'):\n"
    "    if p.isdigit():\n"
    "        try:\n"
    "            procs[p] = open(f'/proc/{p}/cmdline','rb').read().replace(b'\\0', b' ').decode()\n"
    "        except OSError:\n"
    "            pass\n"
    "print(json.dumps(procs))\n"
)


async def processes(client: AgentClient) -> dict[int, str]:
    """pid -> command line of every process in the container (the lister included)."""
    reply = await run(client, code=PROCESS_LIST)
    assert reply.status is SandboxStatus.OK, reply.stderr
    return {int(pid): cmd for pid, cmd in json.loads(reply.stdout).items()}


async def settled_processes(
    client: AgentClient, count: int, within_s: float = 10.0
) -> dict[int, str]:
    """The process table once it holds ``count`` processes: the zygote forks the spare
    behind the lister asynchronously, so a loaded machine may list it a moment late."""
    deadline = time.monotonic() + within_s
    while len(found := await processes(client)) != count and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return found


async def test_ping(client: AgentClient) -> None:
    reply = await client.ping()
    assert reply["ok"] is True and reply["version"] == 1
    assert reply["pid"] == 1, "the agent is the container's init"
    assert {"python", "bash", "sh", "c", "cpp", "js", "openscad"} <= set(reply["languages"])


@pytest.mark.parametrize(
    ("language", "code", "stdout"),
    [
        ("cpp", '#include <cstdio>\nint main() { std::puts("cpp"); }', b"cpp\n"),
        ("js", "console.log(require('os').userInfo().uid)", b"10001\n"),
        ("openscad", "echo(6 * 7); cube(1);", b""),
    ],
)
async def test_each_toolchain_runs_offline_as_the_sandbox_user(
    client: AgentClient, language: str, code: str, stdout: bytes
) -> None:
    reply = await run(client, language=language, code=code, timeout_s=60.0)
    assert (reply.status, reply.stdout) == (SandboxStatus.OK, stdout), reply.stderr
    if language == "openscad":  # no X display in the image: STL export only
        assert b"ECHO: 42" in reply.stderr


async def test_python_runs_as_the_sandbox_user(client: AgentClient) -> None:
    code = "import os, sys; print(os.getuid(), os.getgid(), os.getcwd(), sys.version_info[:2])"
    reply = await run(client, code=code)
    assert reply.status is SandboxStatus.OK, reply.stderr
    assert reply.stdout == b"10001 10001 /work (3, 11)\n"


async def test_bash_runs(client: AgentClient) -> None:
    reply = await run(
        client, language="bash", code='echo "$(id -u) $HOME $BASH_VERSION" | cut -c1-20'
    )
    assert reply.status is SandboxStatus.OK, reply.stderr
    assert reply.stdout.startswith(b"10001 /work 5.")


async def test_root_is_read_only_and_workdir_writable(client: AgentClient) -> None:
    reply = await run(client, code="open('/etc/evil', 'w').write('x')")
    assert reply.status is SandboxStatus.NONZERO_EXIT
    assert b"Read-only file system" in reply.stderr or b"Permission denied" in reply.stderr
    for path in (
        "/opt/temper/agent/__main__.py",
        "/opt/temper/agent/zygote.py",
        "/opt/temper/agent/x",
    ):
        reply = await run(client, language="bash", code=f"touch {path}")
        assert reply.status is SandboxStatus.NONZERO_EXIT, path
    reply = await run(client, language="bash", code="echo data > f && cat f && rm f")
    assert (reply.status, reply.stdout) == (SandboxStatus.OK, b"data\n")


async def test_no_network(client: AgentClient) -> None:
    code = (
        "import socket\n"
        "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
        "except OSError as e:\n    print('blocked', e.errno)\n"
        "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))\n"
    )
    reply = await run(client, code=code)
    assert reply.stdout.startswith(b"blocked ")
    assert reply.stdout.endswith(b"['lo']\n")


PEER_PROBE = (
    "import json, socket, struct\n"
    "s = socket.socket(socket.AF_UNIX); s.connect('/run/temper/agent.sock')\n"
    "body = json.dumps({'op': 'reset'}).encode()\n"
    "s.sendall(struct.pack('>I', len(body)) + body)\n"
    "n = struct.unpack('>I', s.recv(4))[0]\n"
    "open('/work/probe.json', 'wb').write(s.recv(n))\n"
)


async def test_inside_peer_cannot_drive_the_agent(client: AgentClient) -> None:
    # The agent serves one request at a time and accepts between requests: the probe
    # connects while this exec runs (it waits in the backlog), is refused right after,
    # and a second exec reads what it was told.  No stdio of the probe points at the
    # exec's pipes, so the exec ends without sweeping it away.
    launch = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {PEER_PROBE!r}], start_new_session=True,\n"
        "                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
        "                 stderr=subprocess.DEVNULL)\n"
        "time.sleep(0.5)\n"
    )
    assert (await run(client, code=launch)).status is SandboxStatus.OK
    assert (await client.ping())["ok"]
    wait = "for i in $(seq 50); do [ -s probe.json ] && break; sleep 0.1; done; cat probe.json"
    answer = json.loads((await run(client, language="bash", code=wait)).stdout)
    assert answer["ok"] is False and "inside the sandbox" in answer["error"]
    assert (await client.ping())["ok"], "the agent keeps serving the host"


async def test_timeout_and_reset_kill_escaped_processes(client: AgentClient) -> None:
    agent_pid = (await client.ping())["pid"]
    pids = await settled_processes(client, 4)
    # The agent, its zygote, the lister (a spare) and the spare waiting behind it.
    assert agent_pid == 1 and 1 in pids and len(pids) == 4, pids
    reply = await run(
        client,
        language="bash",
        code="setsid sleep 300 & setsid sleep 301 & sleep 300",
        timeout_s=0.5,
    )
    assert reply.status is SandboxStatus.TIMEOUT
    assert not [c for c in (await processes(client)).values() if c.startswith("sleep")]
    reply = await run(
        client,
        language="bash",
        code="setsid sleep 302 </dev/null >/dev/null 2>&1 & sleep 0.3; echo ok",
    )
    assert reply.status is SandboxStatus.OK
    assert [c for c in (await processes(client)).values() if c.startswith("sleep")]
    await run(client, language="bash", code="mkdir -p d/e && touch .dot d/e/f")
    assert await client.reset(timeout_s=10.0) >= 1
    after = await settled_processes(client, 4)
    assert len(after) == 4 and 1 in after, after
    assert (await run(client, argv=["ls", "-A"])).stdout == b""


async def test_exec_rate_and_no_zombies(client: AgentClient) -> None:
    n = 300
    started = time.perf_counter()
    for i in range(n):
        reply = await run(client, id=f"r{i}", code="print(1)")
        assert reply.status is SandboxStatus.OK
    rate = n / (time.perf_counter() - started)
    print(f"python fast path inside the container: {rate:.0f} execs/s (sequential)")
    states = await run(
        client, language="bash", code="cat /proc/[0-9]*/stat | awk '{print $3}' | sort | uniq -c"
    )
    assert b" Z" not in states.stdout, states.stdout
