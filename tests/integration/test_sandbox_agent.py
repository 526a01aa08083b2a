"""The sandbox agent on the host (no container mode), driven through AgentClient.

Each test starts its own agent as a subprocess with a temporary socket and workdir.
No Docker: this is the agent's contract on its own (protocol, limits, kills, reaping).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from protocol.messages import SandboxStatus
from services.sandbox.agent_client import (
    AgentClient,
    AgentRejected,
    AgentTimeout,
    AgentUnavailable,
    ExecLimits,
    ExecReply,
    ExecRequest,
)

#: The agent package, run as ``python3 <directory>`` as the image and the local backend do.
AGENT = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "agent"
WATCHDOG_S = 30.0
MIB = 1024 * 1024


@dataclass
class RunningAgent:
    proc: subprocess.Popen[bytes]
    socket: Path
    workdir: Path


@contextlib.contextmanager
def start_agent(tmp_path: Path, *extra: str) -> Iterator[RunningAgent]:
    """An agent subprocess, ready (socket in place); SIGTERM-ed and checked on the way out."""
    # AF_UNIX paths are capped at 108 bytes: pytest's tmp_path can be longer.
    sock_dir = Path(tempfile.mkdtemp(prefix="tsa-"))
    workdir = tmp_path / "work"
    socket_path = sock_dir / "agent.sock"
    argv = [sys.executable, str(AGENT), "--socket", str(socket_path), "--workdir", str(workdir)]
    env = {**os.environ, "TEMPER_AGENT_TEST_SECRET": "must-not-leak"}
    log_path = tmp_path / "agent.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*argv, *extra], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
        )
    try:
        deadline = time.monotonic() + 10.0
        while not socket_path.exists():  # the agent renames it into place once listening
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "the agent did not start"
            time.sleep(0.005)
        yield RunningAgent(proc, socket_path, workdir)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0, log_path.read_text()
            assert not socket_path.exists(), "the agent removes its socket on SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(sock_dir, ignore_errors=True)


async def run(client: AgentClient, **fields: Any) -> ExecReply:
    fields.setdefault("id", "t")
    fields.setdefault("timeout_s", 10.0)
    return await client.exec(ExecRequest(**fields), timeout_s=WATCHDOG_S)


async def raw_exchange(path: Path, frames: list[bytes]) -> list[dict[str, Any] | None]:
    """Send raw frames on one connection; each reply, or None once the agent closed it."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    replies: list[dict[str, Any] | None] = []
    try:
        for frame in frames:
            try:
                writer.write(frame)
                await writer.drain()
                (length,) = struct.unpack(">I", await reader.readexactly(4))
                replies.append(json.loads(await reader.readexactly(length)))
            except (asyncio.IncompleteReadError, ConnectionError):
                replies.append(None)
                break
        return replies
    finally:
        writer.close()


def frame(obj: Any) -> bytes:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_dead(pid: int, within_s: float = 5.0) -> bool:
    end = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def peak_rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is pid."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append((int(name), fields[0]))
    return found


async def helpers_of(agent: RunningAgent, count: int = 2) -> list[int]:
    """The agent's live children once there are ``count``: the zygote and its spares (two
    at start and after a reset, one after a run)."""
    for _ in range(500):
        found = [pid for pid, state in children_of(agent.proc.pid) if state != "Z"]
        if len(found) == count:
            return found
        await asyncio.sleep(0.01)
    return found


# --------------------------------------------------------------------------- basics


async def test_ping(client: AgentClient, agent: RunningAgent) -> None:
    reply = await client.ping()
    assert reply["ok"] is True
    assert reply["pid"] == agent.proc.pid
    assert reply["version"] == 1
    assert {"python", "bash", "sh"} <= set(reply["languages"])


async def test_python_hello(client: AgentClient) -> None:
    reply = await run(client, code="print('hello from python')")
    assert reply.status is SandboxStatus.OK
    assert (reply.exit_code, reply.signal) == (0, None)
    assert reply.stdout == b"hello from python\n"
    assert reply.stderr == b""
    assert not reply.stdout_truncated and not reply.stderr_truncated
    assert reply.id == "t" and reply.error is None and 0 < reply.duration_s < 5


async def test_bash_hello(client: AgentClient) -> None:
    reply = await run(client, language="bash", code='echo "hello from $0" | tr a-z A-Z; echo e >&2')
    assert reply.status is SandboxStatus.OK
    assert reply.stdout.startswith(b"HELLO FROM ")
    assert reply.stderr == b"e\n"


@pytest.mark.parametrize(
    ("language", "code", "exit_code"),
    [
        ("python", "import sys; sys.exit(3)", 3),
        ("python", "raise SystemExit(3)", 3),
        ("python", "raise SystemExit(300)", 300 & 0xFF),
        ("python", "import sys; sys.exit()", 0),
        ("bash", "exit 7", 7),
        ("sh", "false", 1),
    ],
)
async def test_exit_codes(client: AgentClient, language: str, code: str, exit_code: int) -> None:
    reply = await run(client, language=language, code=code)
    assert reply.exit_code == exit_code
    assert reply.status is (SandboxStatus.OK if exit_code == 0 else SandboxStatus.NONZERO_EXIT)


async def test_system_exit_message(client: AgentClient) -> None:
    reply = await run(client, code="import sys; sys.exit('giving up')")
    assert (reply.status, reply.exit_code) == (SandboxStatus.NONZERO_EXIT, 1)
    assert reply.stderr == b"giving up\n"


async def test_exception_gives_exit_1_and_traceback(client: AgentClient) -> None:
    reply = await run(
        client, code="print('before', flush=True)\ndef f():\n    raise ValueError('boom')\nf()"
    )
    assert (reply.status, reply.exit_code) == (SandboxStatus.NONZERO_EXIT, 1)
    assert reply.stdout == b"before\n"
    stderr = reply.stderr.decode()
    assert stderr.startswith("Traceback (most recent call last):\n")
    assert 'File "<sandbox>", line 4, in <module>' in stderr
    assert stderr.endswith("ValueError: boom\n")
    assert str(AGENT) not in stderr, "the agent's own frames are hidden"
    assert "sandbox/agent" not in stderr and "_temper_sandbox_agent" not in stderr


async def test_syntax_error(client: AgentClient) -> None:
    reply = await run(client, code="def (:\n")
    assert (reply.status, reply.exit_code) == (SandboxStatus.NONZERO_EXIT, 1)
    assert b"SyntaxError" in reply.stderr


async def test_python_behaves_like_a_script(client: AgentClient) -> None:
    code = (
        "import atexit, sys, threading, time\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.05), print('thread done'))).start()\n"
        "print(__name__, sys.argv, repr(sys.path[0]))\n"
        "import __main__; print(__main__.__dict__ is globals())\n"
    )
    reply = await run(client, code=code)
    assert reply.status is SandboxStatus.OK, reply.stderr
    assert reply.stdout == b"__main__ ['-c'] ''\nTrue\nthread done\natexit ran\n"


async def test_signal_killed(client: AgentClient) -> None:
    reply = await run(client, code="import os; os.kill(os.getpid(), 9)")
    assert reply.status is SandboxStatus.KILLED
    assert (reply.exit_code, reply.signal) == (None, 9)


async def test_stdin(client: AgentClient) -> None:
    reply = await run(client, code="import sys; print(sys.stdin.read().upper())", stdin=b"abc")
    assert reply.stdout == b"ABC\n"
    reply = await run(client, language="bash", code="read a b; echo $b $a", stdin=b"one two\n")
    assert reply.stdout == b"two one\n"


async def test_large_stdin_round_trip(client: AgentClient) -> None:
    data = os.urandom(3 * MIB)
    reply = await run(client, argv=["cat"], stdin=data, output_bytes=4 * MIB)
    assert reply.status is SandboxStatus.OK
    assert reply.stdout == data


async def test_unread_stdin_does_not_block(client: AgentClient) -> None:
    reply = await run(client, code="print('ignored stdin')", stdin=b"x" * (2 * MIB))
    assert reply.status is SandboxStatus.OK
    assert reply.stdout == b"ignored stdin\n"


async def test_files_written_and_visible(client: AgentClient, agent: RunningAgent) -> None:
    files = {"data/in.txt": b"hello file", "top.bin": b"\x00\xff", ".hidden": b"dot"}
    code = "print(open('data/in.txt').read(), len(open('top.bin','rb').read()))"
    reply = await run(client, code=code, files=files)
    assert reply.stdout == b"hello file 2\n"
    assert (agent.workdir / "data" / "in.txt").read_bytes() == b"hello file"
    reply = await run(client, language="bash", code="cat data/in.txt; echo; ls -A | sort")
    assert reply.stdout.startswith(b"hello file\n")
    # .temper/ holds the bash code file while it runs, and is removed afterwards.
    assert reply.stdout.decode().split()[2:] == [".hidden", ".temper", "data", "top.bin"]
    reply = await run(client, argv=["ls", "-A"])
    assert reply.stdout.split() == [b".hidden", b"data", b"top.bin"]


async def test_cwd_home_and_clean_environment(client: AgentClient, agent: RunningAgent) -> None:
    code = "import json, os; print(json.dumps({'cwd': os.getcwd(), 'env': dict(os.environ)}))"
    reply = await run(client, code=code, env={"MY_VAR": "42"})
    seen = json.loads(reply.stdout)
    assert seen["cwd"] == str(agent.workdir)
    env = seen["env"]
    assert env["HOME"] == str(agent.workdir) and env["LANG"] == "C.UTF-8"
    assert env["MY_VAR"] == "42" and "PATH" in env
    assert "TEMPER_AGENT_TEST_SECRET" not in env
    reply = await run(client, language="bash", code="echo $MY_VAR $HOME", env={"MY_VAR": "7"})
    assert reply.stdout == f"7 {agent.workdir}\n".encode()
    # The spare's own environment is a run's default one: a run asking for nothing more
    # changes nothing, one asking for more must not leave it to the next.
    changed = json.loads((await run(client, code=code, env={"HOME": "/x", "EXTRA": "1"})).stdout)
    assert (changed["env"]["HOME"], changed["env"]["EXTRA"]) == ("/x", "1")
    plain = json.loads((await run(client, code=code)).stdout)["env"]
    assert plain == {
        "PATH": env["PATH"],
        "HOME": str(agent.workdir),
        "TMPDIR": str(agent.workdir),
        "LANG": "C.UTF-8",
    }


async def test_rlimits(client: AgentClient) -> None:
    code = (
        "import resource as r\n"
        "print(r.getrlimit(r.RLIMIT_NOFILE), r.getrlimit(r.RLIMIT_CORE), r.getrlimit(r.RLIMIT_AS))"
    )
    reply = await run(client, code=code)
    assert reply.stdout.startswith(b"(256, 256) (0, 0)")
    limits = ExecLimits(nofile=64, memory_bytes=512 * MIB)
    reply = await run(client, code=code, limits=limits)
    assert reply.stdout == f"(64, 64) (0, 0) ({512 * MIB}, {512 * MIB})\n".encode()
    reply = await run(client, code="x = bytearray(1024 * 1024 * 1024)", limits=limits)
    assert reply.status is SandboxStatus.NONZERO_EXIT and b"MemoryError" in reply.stderr


async def test_argv_requests(client: AgentClient) -> None:
    reply = await run(client, argv=["echo", "a b", "$HOME"])
    assert (reply.status, reply.stdout) == (SandboxStatus.OK, b"a b $HOME\n")
    reply = await run(client, argv=["sh", "-c", "exit 4"])
    assert (reply.status, reply.exit_code) == (SandboxStatus.NONZERO_EXIT, 4)
    reply = await run(client, argv=["no-such-binary-here"])
    assert (reply.status, reply.exit_code) == (SandboxStatus.NONZERO_EXIT, 127)
    assert b"cannot execute" in reply.stderr


# --------------------------------------------------------------------------- limits and kills


async def test_timeout_kills_loop(client: AgentClient) -> None:
    started = time.monotonic()
    reply = await run(client, code="while True: pass", timeout_s=0.5)
    assert reply.status is SandboxStatus.TIMEOUT
    assert (reply.exit_code, reply.signal) == (None, signal.SIGKILL)
    assert 0.5 <= reply.duration_s < 2.0
    assert time.monotonic() - started < 3.0


async def test_timeout_kills_sleeping_grandchild(client: AgentClient, agent: RunningAgent) -> None:
    code = (
        "import subprocess, time\n"
        "p = subprocess.Popen(['sleep', '300'])\n"
        "open('grandchild.pid', 'w').write(str(p.pid))\n"
        "time.sleep(300)\n"
    )
    started = time.monotonic()
    reply = await run(client, code=code, timeout_s=0.5)
    assert reply.status is SandboxStatus.TIMEOUT
    assert time.monotonic() - started < 3.0
    grandchild = int((agent.workdir / "grandchild.pid").read_text())
    assert wait_dead(grandchild), "the grandchild sleeping in the group is killed too"


async def test_bash_timeout_with_grandchild(client: AgentClient) -> None:
    started = time.monotonic()
    reply = await run(client, language="bash", code="sleep 300 & sleep 300; wait", timeout_s=0.3)
    assert reply.status is SandboxStatus.TIMEOUT
    assert time.monotonic() - started < 3.0


async def test_output_flood_is_cut(client: AgentClient, agent: RunningAgent) -> None:
    code = (
        "import sys\nchunk = b'x' * (1024 * 1024)\n"
        "for _ in range(200):\n    sys.stdout.buffer.write(chunk)\n"
    )
    started = time.monotonic()
    reply = await run(client, code=code, output_bytes=MIB, timeout_s=60.0)
    assert time.monotonic() - started < 5.0
    assert reply.status is SandboxStatus.OUTPUT_LIMIT
    assert reply.stdout_truncated and not reply.stderr_truncated
    assert len(reply.stdout) == MIB and set(reply.stdout) == {ord("x")}
    assert reply.signal == signal.SIGKILL
    peak_kb = peak_rss_kb(agent.proc.pid)
    assert peak_kb < 128 * 1024, f"agent peak RSS {peak_kb} kB after a 200 MB flood"


async def test_stderr_flood_from_bash(client: AgentClient) -> None:
    reply = await run(client, language="bash", code="yes >&2", output_bytes=100_000)
    assert reply.status is SandboxStatus.OUTPUT_LIMIT
    assert reply.stderr_truncated and len(reply.stderr) == 100_000


async def test_output_exactly_at_cap_is_not_truncated(client: AgentClient) -> None:
    reply = await run(client, code="print('x' * 99)", output_bytes=100)
    assert reply.status is SandboxStatus.OK
    assert len(reply.stdout) == 100 and not reply.stdout_truncated


async def test_background_child_keeping_stdout_does_not_hang(client: AgentClient) -> None:
    started = time.monotonic()
    reply = await run(client, language="bash", code="sleep 30 & echo done", timeout_s=20.0)
    assert time.monotonic() - started < 2.0
    assert (reply.status, reply.stdout) == (SandboxStatus.OK, b"done\n")
    code = "import subprocess; subprocess.Popen(['sleep', '30']); print('parent exits')"
    reply = await run(client, code=code, timeout_s=20.0)
    assert time.monotonic() - started < 4.0
    assert (reply.status, reply.stdout) == (SandboxStatus.OK, b"parent exits\n")


async def test_child_cannot_see_agent_fds(client: AgentClient) -> None:
    code = (
        "import os\nopen_fds = []\nfor fd in range(4096):\n"
        "    try:\n        os.fstat(fd)\n    except OSError:\n        continue\n"
        "    open_fds.append(fd)\nprint(open_fds)\n"
    )
    reply = await run(client, code=code)
    assert reply.stdout == b"[0, 1, 2]\n"
    reply = await run(client, language="bash", code="ls /proc/self/fd | sort -n | tr '\\n' ' '")
    assert reply.stdout == b"0 1 2 3 ", "only stdio (and ls's own directory fd)"
    reply = await run(client, argv=["sh", "-c", "ls -l /proc/$$/fd"])
    assert b"socket:" not in reply.stdout


async def test_cancel_on_disconnect(agent: RunningAgent) -> None:
    client = await AgentClient.connect(agent.socket, timeout_s=10.0)
    request = ExecRequest(
        id="c", code="import os, time\nopen('me.pid','w').write(str(os.getpid()))\ntime.sleep(60)"
    )
    with pytest.raises(AgentTimeout) as caught:
        await client.exec(request, timeout_s=0.5)
    assert caught.value.op == "exec" and client.closed
    with pytest.raises(AgentUnavailable):
        await client.ping()
    started = time.monotonic()
    async with await AgentClient.connect(agent.socket, timeout_s=10.0) as fresh:
        assert (await fresh.ping())["ok"]
    assert time.monotonic() - started < 2.0, "closing the connection cancelled the exec"
    assert wait_dead(int((agent.workdir / "me.pid").read_text()))


# --------------------------------------------------------------------------- bad input


async def test_bad_frames_keep_the_agent_serving(agent: RunningAgent) -> None:
    replies = await raw_exchange(
        agent.socket,
        [
            frame(b"{not json"),
            frame(b"\xff\xfe"),
            frame([1, 2, 3]),
            frame({"op": "fly"}),
            frame({"no": "op"}),
            frame(b""),
            frame({"op": "ping"}),
        ],
    )
    assert all(r is not None and r["ok"] is False and r["error"] for r in replies[:-1]), replies
    assert replies[-1] is not None and replies[-1]["ok"] is True
    replies = await raw_exchange(agent.socket, [struct.pack(">I", 2**31), frame({"op": "ping"})])
    assert replies[0] is not None and "cap" in replies[0]["error"]
    assert replies[1:] == [None], "an oversized frame closes that connection"
    async with await AgentClient.connect(agent.socket, timeout_s=5.0) as c:
        assert (await c.ping())["ok"]


BASE_EXEC = {"op": "exec", "id": "b", "language": "python", "code": "print(1)"}


@pytest.mark.parametrize(
    "change",
    [
        {"files": {"/etc/passwd": "eA=="}},
        {"files": {"../escape.txt": "eA=="}},
        {"files": {"a/../../escape.txt": "eA=="}},
        {"files": {"": "eA=="}},
        {"files": {"ok.txt": "not base64!"}},
        {"language": "cobol"},
        {"argv": ["echo", "both"]},
        {"code": None},
        {"code": None, "argv": []},
        {"id": 5},
        {"timeout_s": -1},
        {"timeout_s": "soon"},
        {"output_bytes": 0},
        {"output_bytes": 1 << 30},
        {"env": {"A=B": "x"}},
        {"env": {"A": 1}},
        {"stdin_b64": "%%%"},
        {"limits": {"nofile": -1}},
    ],
    ids=lambda change: json.dumps(change),
)
async def test_bad_requests_are_rejected(
    agent: RunningAgent, change: dict[str, Any], tmp_path: Path
) -> None:
    replies = await raw_exchange(
        agent.socket, [frame({**BASE_EXEC, **change}), frame({"op": "ping"})]
    )
    assert replies[0] is not None and replies[0]["ok"] is False, replies
    assert replies[1] is not None and replies[1]["ok"] is True
    assert not (tmp_path / "escape.txt").exists()


async def test_rejection_through_the_client(client: AgentClient) -> None:
    with pytest.raises(AgentRejected) as caught:
        await run(client, code="1", language="cobol")
    assert caught.value.op == "exec" and "cobol" in caught.value.error
    assert not client.closed
    assert (await run(client, code="print(2)")).stdout == b"2\n"
    with pytest.raises(ValueError, match="exactly one"):
        ExecRequest(id="x", code="1", argv=["true"])


async def test_files_never_follow_symlinks(client: AgentClient, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    reply = await run(client, argv=["ln", "-s", str(outside), "link"])
    assert reply.status is SandboxStatus.OK
    with pytest.raises(AgentRejected):
        await run(client, code="1", files={"link/x.txt": b"escaped"})
    reply = await run(client, argv=["ln", "-s", str(outside / "f.txt"), "f.txt"])
    with pytest.raises(AgentRejected):
        await run(client, code="1", files={"f.txt": b"escaped"})
    assert list(outside.iterdir()) == []


# --------------------------------------------------------------------------- reset, reaping


async def test_reset_empties_workdir(client: AgentClient, agent: RunningAgent) -> None:
    code = (
        "mkdir -p a/b/c .dotdir && touch .dotfile a/b/c/f top && ln -s /etc link\n"
        "mkdir locked && touch locked/x && chmod 000 locked\n"
    )
    reply = await run(client, language="bash", code=code)
    assert reply.status is SandboxStatus.OK, reply.stderr
    assert len(list(agent.workdir.iterdir())) == 6
    assert await client.reset(timeout_s=10.0) == 0
    assert agent.workdir.is_dir() and list(agent.workdir.iterdir()) == []
    assert (await run(client, code="print('after reset')")).stdout == b"after reset\n"


async def test_reset_done_unasked_after_an_exec(client: AgentClient, agent: RunningAgent) -> None:
    request = ExecRequest(id="r", language="bash", code="touch left-behind; sleep 30 &")
    reply = await client.exec(request, timeout_s=WATCHDOG_S, reset_after=True)
    assert reply.status is SandboxStatus.OK
    # The agent cleans up without being asked again: reset() only reads its answer.
    for _ in range(500):
        if not list(agent.workdir.iterdir()):
            break
        await asyncio.sleep(0.01)
    assert list(agent.workdir.iterdir()) == []
    assert await client.reset(timeout_s=10.0) == 0  # its group was killed with the exec
    assert (await run(client, code="print('next')")).stdout == b"next\n"
    assert await client.reset(timeout_s=10.0) == 0  # a plain reset again: sent and answered


async def test_another_request_before_the_reset_answer_is_refused(
    client: AgentClient,
) -> None:
    request = ExecRequest(id="r", code="pass")
    await client.exec(request, timeout_s=WATCHDOG_S, reset_after=True)
    # Its reply would be the reset's answer: the client refuses rather than misread it.
    with pytest.raises(AgentUnavailable):
        await client.ping()
    assert client.closed


async def test_the_reset_answer_follows_a_refused_exec_too(agent: RunningAgent) -> None:
    # The host reads a reset's answer after any reply to an exec that asked for one.
    reader, writer = await asyncio.open_unix_connection(str(agent.socket))
    try:
        (agent.workdir / "left").write_bytes(b"x")
        bad = {"op": "exec", "id": "b", "code": "1", "language": "cobol", "reset_after": True}
        writer.write(frame(bad) + frame({"op": "ping"}))
        await writer.drain()
        replies = []
        for _ in range(3):
            (length,) = struct.unpack(">I", await reader.readexactly(4))
            replies.append(json.loads(await reader.readexactly(length)))
    finally:
        writer.close()
    assert replies[0]["ok"] is False and "cobol" in replies[0]["error"]
    assert replies[1] == {"ok": True, "killed": 0}
    assert replies[2]["ok"] is True and "pid" in replies[2]  # the ping, in its turn
    assert list(agent.workdir.iterdir()) == []


async def test_no_zombies_after_many_execs(client: AgentClient, agent: RunningAgent) -> None:
    for i in range(300):
        reply = await run(client, id=f"z{i}", code="print(1)")
        assert reply.status is SandboxStatus.OK
    await run(client, language="bash", code="sleep 0.01 & true")
    assert not [pid for pid, state in children_of(agent.proc.pid) if state == "Z"]
    assert len(await helpers_of(agent)) == 2, "only the zygote and the next run's spare"


async def test_agent_death_is_unavailable(agent: RunningAgent) -> None:
    client = await AgentClient.connect(agent.socket, timeout_s=10.0)
    code = "import os, time\nopen('me.pid','w').write(str(os.getpid()))\ntime.sleep(30)"
    task = asyncio.create_task(client.exec(ExecRequest(id="d", code=code), timeout_s=20))
    pid_file = agent.workdir / "me.pid"
    for _ in range(500):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.01)
    agent.proc.kill()
    agent.proc.wait(timeout=5)
    with pytest.raises(AgentUnavailable):
        await task
    assert wait_dead(int(pid_file.read_text())), "the running exec dies with its agent"
    with pytest.raises(AgentUnavailable):
        await AgentClient.connect(agent.socket, timeout_s=0.2)


async def test_connect_waits_for_the_socket(tmp_path: Path) -> None:
    with pytest.raises(AgentUnavailable, match="no agent within"):
        await AgentClient.connect(tmp_path / "missing.sock", timeout_s=0.1)


# --------------------------------------------------------------------------- options, lifecycle


async def test_language_table_override(tmp_path: Path) -> None:
    table = json.dumps({"py-spawn": ["python3", "-I", "{file}"], "sh": None})
    with start_agent(tmp_path, "--languages", table) as running:
        async with await AgentClient.connect(running.socket, timeout_s=10.0) as c:
            languages = set((await c.ping())["languages"])
            assert languages == {"bash", "c", "cpp", "js", "openscad", "python", "py-spawn"}
            reply = await run(c, language="py-spawn", code="import os; print(os.getppid() > 1)")
            assert (reply.status, reply.stdout) == (SandboxStatus.OK, b"True\n")
            with pytest.raises(AgentRejected, match="unknown language"):
                await run(c, language="sh", code="true")


def test_container_mode_refused_outside_a_pid_namespace(tmp_path: Path) -> None:
    def agent_exits(socket_path: Path, workdir: Path, *extra: str) -> tuple[int, str]:
        argv = [str(AGENT), "--socket", str(socket_path), "--workdir", str(workdir), *extra]
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=30)
        return done.returncode, done.stderr

    code, stderr = agent_exits(tmp_path / "s", tmp_path / "w", "--container")
    assert code == 2 and "refusing --container" in stderr
    code, stderr = agent_exits(tmp_path / "w" / "s", tmp_path / "w")
    assert code == 2 and "inside the workdir" in stderr


async def test_sigterm_during_an_exec_kills_it(tmp_path: Path) -> None:
    with start_agent(tmp_path) as running:
        client = await AgentClient.connect(running.socket, timeout_s=10.0)
        code = "import os, time\nopen('me.pid','w').write(str(os.getpid()))\ntime.sleep(60)"
        task = asyncio.create_task(client.exec(ExecRequest(id="s", code=code), timeout_s=20))
        pid_file = running.workdir / "me.pid"
        for _ in range(500):
            if pid_file.exists() and pid_file.read_text():
                break
            await asyncio.sleep(0.01)
        running.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(running.proc.wait, 10) == 0
        with pytest.raises(AgentUnavailable):
            await task
        assert wait_dead(int(pid_file.read_text()))
        assert not running.socket.exists()


async def test_planted_fifo_is_refused_without_blocking(client: AgentClient) -> None:
    assert (await run(client, argv=["mkfifo", "pipe"])).status is SandboxStatus.OK
    with pytest.raises(AgentRejected, match="not a regular file"):
        await run(client, code="1", files={"pipe": b"would block"})
    assert (await client.ping())["ok"]


async def test_reset_recreates_a_removed_workdir(client: AgentClient, agent: RunningAgent) -> None:
    reply = await run(client, code="import os, shutil; shutil.rmtree(os.getcwd())")
    assert reply.status is SandboxStatus.OK
    reply = await run(client, code="print(1)")
    assert reply.status is SandboxStatus.INFRA_ERROR and "child setup failed" in (reply.error or "")
    assert await client.reset(timeout_s=10.0) == 0
    assert (await run(client, code="print('back')")).stdout == b"back\n"


@pytest.mark.parametrize(
    "reply",
    [
        frame(b"not json"),
        frame([1]),
        struct.pack(">I", 2**31),
        frame({"id": "other", "status": "ok"}),
        frame({"id": "p", "status": "weird"}),
        b"\x00\x00",  # then EOF inside the header
    ],
    ids=["not-json", "not-object", "oversized", "missing-fields", "bad-status", "truncated"],
)
async def test_client_refuses_a_misbehaving_agent(reply: bytes) -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="tsf-"))

    async def fake_agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (length,) = struct.unpack(">I", await reader.readexactly(4))
        await reader.readexactly(length)
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(fake_agent, path=str(sock_dir / "fake.sock"))
    try:
        async with server, await AgentClient.connect(sock_dir / "fake.sock", 5.0) as client:
            with pytest.raises(AgentUnavailable):  # AgentProtocolError is a subclass
                await client.exec(ExecRequest(id="p", code="1"), timeout_s=5.0)
            assert client.closed
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


# --------------------------------------------------------------------------- runs apart

#: Counts the secret in this process's writable memory, never holding it whole itself:
#: its two halves arrive reversed and stay apart.
MEMORY_SCAN = """
import ctypes
head, tail = HEAD[::-1].encode(), TAIL[::-1].encode()
found = 0
for line in open("/proc/self/maps"):
    span, perms = line.split()[:2]
    if not perms.startswith("rw"):
        continue
    start, end = (int(x, 16) for x in span.split("-"))
    try:
        data = ctypes.string_at(start, end - start)
    except (OSError, ValueError):
        continue
    at = data.find(head)
    while at >= 0:
        found += data[at + len(head) : at + len(head) + len(tail)] == tail
        at = data.find(head, at + 1)
print(found)
"""


def memory_scan(secret: str) -> str:
    head, tail = secret[:16], secret[16:]
    return MEMORY_SCAN.replace("HEAD", repr(head[::-1])).replace("TAIL", repr(tail[::-1]))


async def test_a_run_cannot_read_earlier_runs_from_memory(client: AgentClient) -> None:
    secret = f"hidden-answer-{os.urandom(8).hex()}"
    code = f"answer = {secret!r}\nprint(len(answer))\n" + "# padding\n" * 500
    earlier: list[tuple[str, dict[str, Any]]] = [
        ("python", {"code": code, "stdin": secret.encode(), "files": {"s": secret.encode()}}),
        ("bash", {"code": f"echo {secret} | wc -c"}),
        ("python", {"code": f"print({secret!r})"}),  # the secret in the agent's reply too
    ]
    for language, request in earlier:
        first = await run(client, language=language, **request)
        assert first.status is SandboxStatus.OK, first
    scan = await run(client, code=memory_scan(secret))
    assert (scan.status, scan.stdout) == (SandboxStatus.OK, b"0\n"), scan
    own = await run(client, code=memory_scan(secret) + f"\nkept = {secret!r}")
    assert int(own.stdout) >= 1, "the scan does find a secret that is there"


REACH_INTO_OTHERS = r"""
import ctypes, errno, json, os, resource, time
libc = ctypes.CDLL(None, use_errno=True)
def call(result):
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
out = {}
out["ptrace agent"] = call(libc.ptrace(16, os.getppid(), None, None))
out["ptrace own child"] = call(libc.ptrace(16, child, None, None))
buf = ctypes.create_string_buffer(8)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
out["process_vm_readv"] = call(libc.process_vm_readv(child, iov, 1, iov, 1, 0))
pidfd = os.pidfd_open(child)
out["pidfd_getfd"] = call(libc.syscall(438, pidfd, 0, 0))
try:
    resource.prlimit(child, resource.RLIMIT_NOFILE, (16, 16))
    out["prlimit other"] = "ok"
except OSError as e:
    out["prlimit other"] = errno.errorcode[e.errno]
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
out["setrlimit self"] = resource.getrlimit(resource.RLIMIT_NOFILE) == (64, 64)
os.kill(child, 9)
print(json.dumps(out))
"""


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="no syscall table")
async def test_runs_cannot_trace_or_reach_into_other_processes(client: AgentClient) -> None:
    reply = await run(client, code=REACH_INTO_OTHERS)
    assert reply.status is SandboxStatus.OK, reply.stderr
    assert json.loads(reply.stdout) == {
        "ptrace agent": "EPERM",
        "ptrace own child": "EPERM",  # the agent's seccomp filter, not just dumpability
        "process_vm_readv": "EPERM",
        "pidfd_getfd": "EPERM",
        "prlimit other": "EPERM",
        "setrlimit self": True,
    }


#: Kills (or stops) every other child of the agent: the zygote, and the spare if one waits.
SIBLINGS = """
import os, signal
me, agent = os.getpid(), os.getppid()
def siblings():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == agent and int(pid) != me and fields[0] != "Z":
            yield int(pid)
hit = [pid for pid in siblings() if os.kill(pid, SIGNAL) is None]
print(len(hit))
"""


async def test_a_killed_zygote_is_replaced(client: AgentClient, agent: RunningAgent) -> None:
    before = set(await helpers_of(agent, 3))
    killed = await run(client, code=SIBLINGS.replace("SIGNAL", "signal.SIGKILL"))
    # The zygote and the spare waiting behind this run's.
    assert (killed.status, killed.stdout) == (SandboxStatus.OK, b"2\n"), killed
    after = await run(client, code="print('still runs')")
    assert after.stdout == b"still runs\n", after
    assert await client.reset(timeout_s=10.0) == 0  # and replaces the one exec-ed meanwhile
    assert (await run(client, code="print('and again')")).stdout == b"and again\n"
    assert not before & set(await helpers_of(agent))


async def test_stopped_helpers_are_continued(client: AgentClient, agent: RunningAgent) -> None:
    stopped = await run(client, code=SIBLINGS.replace("SIGNAL", "signal.SIGSTOP"))
    assert stopped.stdout == b"2\n", stopped  # the zygote and the spare waiting behind
    after = await run(client, code="print('continued')")  # in that stopped spare
    assert after.stdout == b"continued\n", after
    assert await client.reset(timeout_s=10.0) == 0
    # A stray that outlived its run could stop the spares as well as the zygote.
    helpers = await helpers_of(agent, 3)
    for pid in helpers:
        os.kill(pid, signal.SIGSTOP)
    assert (await run(client, code="print('again')")).stdout == b"again\n"
    assert await client.reset(timeout_s=10.0) == 0
    assert set(await helpers_of(agent, 3)) & set(helpers), "continued, not replaced"


async def test_orphans_are_reaped_while_a_run_goes_on(client: AgentClient) -> None:
    code = (
        "import os, time\n"
        "for _ in range(20):\n"
        "    if os.fork() == 0:\n"
        "        if os.fork() == 0:\n"
        "            os._exit(0)\n"  # its parent is gone: an orphan of the agent's
        "        os._exit(0)\n"
        "time.sleep(0.5)\n"
        "agent = os.getppid()\n"
        "zombies = 0\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        fields = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()\n"
        "    except OSError:\n"
        "        continue\n"
        "    zombies += fields[0] == 'Z' and int(fields[1]) == agent\n"
        "print(zombies)\n"
    )
    reply = await run(client, code=code)
    assert (reply.status, reply.stdout) == (SandboxStatus.OK, b"0\n"), reply


# --------------------------------------------------------------------------- C

C_PROGRAM = r"""
#include <math.h>
#include <stdio.h>
int main(void) {
    char name[32];
    if (scanf("%31s", name) != 1) return 1;
    printf("hello %s %.3f\n", name, sqrt(2.0));
    return 3;
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc on this host")
async def test_c_is_built_then_run(client: AgentClient, agent: RunningAgent) -> None:
    reply = await run(client, language="c", code=C_PROGRAM, stdin=b"world")
    assert (reply.status, reply.exit_code) == (SandboxStatus.NONZERO_EXIT, 3), reply.stderr
    assert reply.stdout == b"hello world 1.414\n"
    broken = await run(client, language="c", code="int main( {")
    assert (broken.status, broken.exit_code) == (SandboxStatus.NONZERO_EXIT, 1)
    assert b"error" in broken.stderr
    assert list(agent.workdir.iterdir()) == [], "the code and what was built from it are gone"


CPP_PROGRAM = r"""
#include <iostream>
#include <string>
#include <vector>
int main() {
    std::string name;
    std::cin >> name;
    std::vector<int> v{1, 2, 3};
    std::cout << "hello " << name << " " << v.size() << std::endl;
    return 4;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this host")
async def test_cpp_is_built_then_run(client: AgentClient, agent: RunningAgent) -> None:
    reply = await run(client, language="cpp", code=CPP_PROGRAM, stdin=b"world")
    assert (reply.status, reply.exit_code) == (SandboxStatus.NONZERO_EXIT, 4), reply.stderr
    assert reply.stdout == b"hello world 3\n"
    broken = await run(client, language="cpp", code="int main() { return undeclared; }")
    assert (broken.status, broken.exit_code) == (SandboxStatus.NONZERO_EXIT, 1)
    assert b"undeclared\xe2\x80\x99 was not declared" in broken.stderr, broken.stderr
    assert broken.stdout == b""
    assert list(agent.workdir.iterdir()) == [], "the code and what was built from it are gone"


@pytest.mark.skipif(shutil.which("node") is None, reason="no node on this host")
async def test_js_runs_under_node(client: AgentClient) -> None:
    code = "const fs = require('fs');\nconsole.log('hello ' + fs.readFileSync(0, 'utf8'));"
    reply = await run(client, language="js", code=code, stdin=b"world")
    assert (reply.status, reply.stdout) == (SandboxStatus.OK, b"hello world\n"), reply.stderr
    broken = await run(client, language="js", code="let x = ;")
    assert (broken.status, broken.exit_code) == (SandboxStatus.NONZERO_EXIT, 1)
    assert b"SyntaxError" in broken.stderr


async def test_a_tasks_own_agent_module_is_not_the_sandbox_agent(client: AgentClient) -> None:
    # The agent package is loaded under a private name: a task's "agent" is its own.
    reply = await run(
        client,
        code="import agent, sys\nprint(agent.NAME, [m for m in sys.modules if 'sandbox' in m])",
        files={"agent.py": b"NAME = 'mine'\n"},
    )
    assert reply.stdout.startswith(b"mine "), reply.stderr


OUTPUTS_SCRIPT = """
mkdir -p d real
printf stl > d/out.stl
printf 'x%.0s' $(seq 100) > big
ln -s /proc/self/comm link
ln -s real linked-dir && printf secret > real/f
mkfifo fifo
exit 3
"""


async def test_outputs_come_back_as_regular_files_only(client: AgentClient) -> None:
    wanted = ["d/out.stl", "big", "link", "linked-dir/f", "fifo", "missing", "d"]
    reply = await run(client, language="bash", code=OUTPUTS_SCRIPT, outputs=wanted, output_bytes=50)
    assert (reply.status, reply.exit_code) == (SandboxStatus.NONZERO_EXIT, 3), reply.stderr
    # No symlink is followed (the agent's own /proc entries), nor a FIFO opened; "big"
    # passes output_bytes.
    assert reply.outputs == {"d/out.stl": b"stl"}
    within = await run(client, language="bash", code="true", outputs=["big", "d/out.stl"])
    assert within.outputs == {"big": b"x" * 100, "d/out.stl": b"stl"}


async def test_outputs_must_stay_in_the_workdir(client: AgentClient) -> None:
    with pytest.raises(AgentRejected, match=r"outputs: path '\.\./x' leaves the workdir"):
        await run(client, code="pass", outputs=["../x"])


async def test_a_language_whose_program_is_missing_is_an_infra_error(tmp_path: Path) -> None:
    table = json.dumps({"cobol": {"argv": ["sh", "{file}"], "needs": "no-such-compiler"}})
    with start_agent(tmp_path, "--languages", table) as running:
        async with await AgentClient.connect(running.socket, timeout_s=10.0) as c:
            reply = await run(c, language="cobol", code="true")
            assert reply.status is SandboxStatus.INFRA_ERROR
            assert "no-such-compiler not installed" in (reply.error or "")


# --------------------------------------------------------------------------- sibling forks

SIBLING = r"""
import ctypes, importlib, os, sys, time
sys.path.insert(0, sys.argv[1])
agent = importlib.import_module("services.sandbox.agent.forks").__dict__
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER, as the agent
read_end, write_end = os.pipe()
top = os.getpid()
zygote = os.fork()
if zygote == 0:
    fork = agent["SiblingFork"].probe() if sys.argv[2] == "clone" else agent["MiddleFork"]()
    if fork is None:
        os._exit(3)
    if fork() == 0:
        pthread_self = libc.pthread_self
        pthread_self.restype = ctypes.c_ulong
        mask = ctypes.create_string_buffer(128)
        # glibc's idea of this thread's id: right only if the fork stored it
        own = libc.pthread_getaffinity_np(ctypes.c_ulong(pthread_self()), 128, mask) == 0
        # A double fork's middle may not have exited yet (the zygote waits for it before it
        # reports a spare, so a real spare is always adopted by then).
        for _ in range(5000):
            if os.getppid() == top:
                break
            time.sleep(0.001)
        os.write(write_end, f"{os.getppid()} {own}".encode())
        os._exit(0)
    os._exit(0)
assert os.waitpid(zygote, 0)[1] == 0
child, status = os.wait()
parent, own = os.read(read_end, 100).decode().split()
print(int(parent) == os.getpid(), own, status)
"""


@pytest.mark.parametrize("how", ["clone", "middle"])
def test_a_spare_is_forked_as_the_agents_own_child(how: str) -> None:
    if how == "clone" and os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("no clone table for this machine")
    done = subprocess.run(
        [sys.executable, "-c", SIBLING, str(AGENT.parents[2]), how],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stdout) == (0, "True True 0\n"), done.stderr


def test_running_child_tells_a_live_spare_from_a_dead_or_foreign_pid() -> None:
    from services.sandbox.agent import running_child

    sleep = shutil.which("sleep")
    assert sleep is not None
    pid = os.posix_spawn(sleep, ["sleep", "30"], dict(os.environ))
    try:
        assert running_child(pid)
    finally:
        os.kill(pid, signal.SIGKILL)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped yet
    assert not running_child(pid)  # and reaped by the check
    assert not running_child(pid)  # no child of ours any more
    assert not running_child(os.getppid())


def test_pending_signals_reads_both_masks_of_a_real_status() -> None:
    from services.sandbox.agent import pending_signals

    status = Path("/proc/self/status").read_bytes()
    assert b"SigPnd:\t" in status and b"ShdPnd:\t" in status  # the format read
    killed = status.replace(b"ShdPnd:\t0000000000000000", b"ShdPnd:\t0000000000000100")
    assert killed != status
    assert pending_signals(killed) == 1 << (signal.SIGKILL - 1)
    hung_up = status.replace(b"SigPnd:\t0000000000000000", b"SigPnd:\t0000000000000001")
    assert pending_signals(hung_up) == 1 << (signal.SIGHUP - 1)


def test_being_killed_is_false_for_a_live_child_and_true_once_it_is_gone() -> None:
    from services.sandbox.agent import being_killed

    sleep = shutil.which("sleep")
    assert sleep is not None
    pid = os.posix_spawn(sleep, ["sleep", "30"], dict(os.environ))
    try:
        assert not being_killed(pid)
        os.kill(pid, signal.SIGKILL)
    finally:
        os.waitpid(pid, 0)
    assert being_killed(pid)


# --------------------------------------------------------------------------- what a run is given


async def test_python_stdio_is_what_python3_gives_a_pipe(client: AgentClient) -> None:
    code = (
        "import sys\n"
        "for name in ('stdin', 'stdout', 'stderr'):\n"
        "    s = getattr(sys, name)\n"
        "    print(s.fileno(), s.encoding, s.errors, s.line_buffering, s.seekable(),"
        " s.isatty(), s is getattr(sys, f'__{name}__'))\n"
        "print(sys.stdin.read(), end='')\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    reply = await run(client, code=code, stdin=b"fed\n")
    assert reply.stdout.decode().splitlines() == [
        "0 utf-8 surrogateescape False False False True",
        "1 utf-8 surrogateescape False False False True",
        "2 utf-8 backslashreplace True False False True",
        "fed",
    ]
    assert reply.stderr == b"to stderr\n"


async def test_the_plan_reaches_the_run_whole(client: AgentClient) -> None:
    # The plan reaches the spare marshal-ed: odd strings, argv, limits and env intact.
    code = (
        "import os, resource, sys\n"
        "print(repr(os.environ['ODD']), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    odd = "é \u2603 \\ \" ' \x01"
    reply = await run(client, code=code, env={"ODD": odd}, limits=ExecLimits(nofile=77))
    assert reply.stdout.decode() == f"{odd!r} 77\n", reply
    argv = await run(client, argv=["printf", "%s|", "a b", odd])
    assert argv.stdout.decode() == f"a b|{odd}|"


def nice_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


@pytest.mark.parametrize(("extra", "expected"), [((), 0), (("--run-nice", "7"), 7)])
async def test_runs_and_helpers_take_the_run_nice_value(
    tmp_path: Path, extra: tuple[str, ...], expected: int
) -> None:
    with start_agent(tmp_path, *extra) as running:
        async with await AgentClient.connect(running.socket, timeout_s=10.0) as client:
            own = nice_of(running.proc.pid)
            reply = await run(client, code="import os; print(os.nice(0))")
            assert reply.stdout == f"{max(own, expected)}\n".encode()
            helpers = await helpers_of(running, 2)
            assert [nice_of(pid) for pid in helpers] == [max(own, expected)] * 2
            assert nice_of(running.proc.pid) == own
            assert await client.reset(timeout_s=10.0) == 0  # helpers at that value: not tampered


def test_run_nice_is_19_in_a_container_and_checked() -> None:
    from services.sandbox.agent import parse_options

    base = ["--socket", "/run/x/agent.sock", "--workdir", "/work"]
    assert parse_options([*base, "--container"]).run_nice == 19
    assert parse_options(base).run_nice == 0
    assert parse_options([*base, "--container", "--run-nice", "0"]).run_nice == 0
    with pytest.raises(SystemExit):
        parse_options([*base, "--run-nice", "20"])
