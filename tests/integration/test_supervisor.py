"""``temper up`` end to end, as a user runs it: the embedded stack, health, restarts, shutdown.

Each test starts its own stack (nats-server on a free port plus every registered
service) as a subprocess and reads what it prints.  Whatever a test leaves running
is killed by pid at teardown, so a failing test cannot leave processes behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import msgspec
import pytest

from protocol import streams, subjects
from protocol.client import TemperClient
from protocol.messages import (
    ChatMessage,
    RolloutStatus,
    ScoreStatus,
    ServiceState,
    StackStatus,
    Task,
)
from services.supervisor import StackSettings, Supervisor
from tests.integration.test_cli_harness import ENV, ROOT, Done, finish, free_port, start, temper

READY_S = 30.0
#: "[temper 12:00:00] control      started (pid 123, log run/logs/control.log)"
STARTED = r"^\[temper [\d:]+\] (?P<name>\S+)\s+started \(pid (?P<pid>\d+)"
NATS_STARTED = r"^\[temper [\d:]+\] nats-server\s+(?P<url>\S+)\s+\(pid (?P<pid>\d+)\)"
EXAMPLE_TASK = "arith-17-plus-25"


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


async def wait_gone(pids: Iterable[int], timeout_s: float = 10.0) -> None:
    pids = list(pids)
    try:
        async with asyncio.timeout(timeout_s):
            while True:  # no event to wait for: the kernel ends them
                if not any(alive(pid) for pid in pids):
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        left = {pid: command_line(pid) for pid in pids if alive(pid)}
        raise AssertionError(f"still running after {timeout_s}s: {left}") from None


class Up:
    """One ``temper up`` subprocess and what it printed so far."""

    def __init__(self, proc: asyncio.subprocess.Process, run_dir: Path, url: str) -> None:
        self.proc = proc
        self.run_dir = run_dir
        self.url = url
        self.lines: list[str] = []
        #: Every pid it reported (nats-server and services), for the checks and the cleanup.
        self.pids: dict[int, str] = {}

    @classmethod
    async def start(
        cls,
        run_dir: Path,
        *options: str,
        new_session: bool = False,
        env: dict[str, str] | None = None,
    ) -> Up:
        port = free_port()
        url = f"nats://127.0.0.1:{port}"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services",
            "--nats-url",
            url,
            "up",
            "--run-dir",
            str(run_dir),
            "--nats-port",
            str(port),
            "--grace",
            "10",
            *options,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=ROOT,
            env={**ENV, **(env or {})},
            start_new_session=new_session,
        )
        return cls(proc, run_dir, url)

    async def line(self, pattern: str, timeout_s: float = READY_S) -> re.Match[str]:
        """Read output until a line matches ``pattern``."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout_s):
            while True:
                raw = await self.proc.stdout.readline()
                assert raw, f"temper up ended before printing {pattern!r}:\n" + "".join(self.lines)
                text = raw.decode()
                self.lines.append(text)
                for regex, kind in ((STARTED, None), (NATS_STARTED, "nats-server")):
                    found = re.match(regex, text)
                    if found:
                        self.pids[int(found["pid"])] = kind or found["name"]
                match = re.search(pattern, text)
                if match:
                    return match

    async def ready(self) -> tuple[int, int]:
        """Wait for "stack up"; returns (nats-server pid, control pid)."""
        nats = await self.line(NATS_STARTED)
        assert nats["url"] == self.url
        control = await self.line(r"control\s+started \(pid (\d+)")
        await self.line(r"control\s+healthy")
        await self.line(r"stack up: `temper --nats-url \S+ status`")
        return int(nats["pid"]), int(control[1])

    async def rest(self, timeout_s: float = 30.0) -> str:
        """Wait for the process to end; returns what it printed after the last line read."""
        assert self.proc.stdout is not None
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout(timeout_s):
                while chunk := await self.proc.stdout.read(65536):
                    chunks.append(chunk)
                await self.proc.wait()
        except TimeoutError:
            left = {pid: command_line(pid) for pid in [self.proc.pid, *self.pids] if alive(pid)}
            printed = "".join(self.lines) + b"".join(chunks).decode(errors="replace")
            raise AssertionError(
                f"temper up still running {timeout_s}s on; alive: {left}; it printed:\n{printed}"
            ) from None
        tail = b"".join(chunks).decode()
        self.lines.append(tail)
        return tail

    def kill_everything(self) -> None:
        for pid in [self.proc.pid, *self.pids]:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def ups() -> AsyncIterator[list[Up]]:
    """Stacks a test starts; at teardown anything of theirs still running is killed."""
    started: list[Up] = []
    try:
        yield started
    finally:
        for up in started:
            up.kill_everything()
            with contextlib.suppress(ProcessLookupError):
                await up.proc.wait()


async def stack(
    ups: list[Up], tmp_path: Path, *options: str, new_session: bool = False
) -> tuple[Up, int, int]:
    up = await Up.start(tmp_path / "run", *options, new_session=new_session)
    ups.append(up)
    nats_pid, control_pid = await up.ready()
    assert alive(nats_pid) and alive(control_pid)
    return up, nats_pid, control_pid


async def submit_example_while_tailing(url: str) -> tuple[dict[str, object], set[str]]:
    """Tail the task subjects while ``examples/submit_task.py`` submits; returns
    (what tail printed, the trace ids of every submission).

    tail subscribes a moment after it starts; the example is run again until tail
    has seen one (the stream deduplicates the repeats; a plain subscriber sees each).
    """
    tail = await start(url, "tail", "temper.v1.task.>", "--count", "1")
    ended = asyncio.ensure_future(tail.wait())
    traces: set[str] = set()
    try:
        for _ in range(10):
            example = await asyncio.create_subprocess_exec(
                sys.executable,
                str(ROOT / "examples" / "submit_task.py"),
                url,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=ROOT,
                env=ENV,
            )
            done = await finish(example)
            assert done.code == 0, done.err
            assert f"task_id='{EXAMPLE_TASK}'" in done.out
            traces.update(re.findall(r"trace_id='([0-9a-f]+)'", done.out))
            await asyncio.wait([ended], timeout=1.0)
            if ended.done():
                break
    finally:
        printed = await finish(tail, timeout_s=5)
    assert printed.code == 0, printed.err
    [line] = printed.out.splitlines()
    return json.loads(line), traces


async def test_up_serves_status_check_tail_and_stops_on_ctrl_c(
    ups: list[Up], tmp_path: Path
) -> None:
    up, nats_pid, control_pid = await stack(ups, tmp_path)
    assert (tmp_path / "run" / "logs" / "control.log").exists()

    status = await temper(up.url, "status")
    assert status.code == 0, status.err
    assert re.search(r"^control\s+\S+\s+running\s+healthy\s", status.out, re.MULTILINE)
    for spec in streams.ALL:
        # Empty; consumers are whatever the services declared.
        assert re.search(rf"^{spec.name}\s+0\s+0\s+\d+\s+0$", status.out, re.MULTILINE), spec.name
    assert "dead letters: 0" in status.out

    as_json = await temper(up.url, "status", "--json")
    assert as_json.code == 0, as_json.err
    decoded = msgspec.json.decode(as_json.out, type=StackStatus)
    [control] = [s for s in decoded.services if s.service == "control"]
    assert (control.state, control.healthy) == (ServiceState.RUNNING, True)
    assert all(s.healthy for s in decoded.services)
    assert [s.name for s in decoded.streams] == [spec.name for spec in streams.ALL]

    check = await temper(up.url, "check", "control")
    assert check.code == 0, check.err
    assert check.out.startswith("control: healthy (running, instance ")
    nosuch = await temper(up.url, "check", "nosuch", "--timeout", "1")
    assert nosuch.code == 1
    assert "nosuch: no answer" in nosuch.err

    record, traces = await submit_example_while_tailing(up.url)
    assert record["subject"] == subjects.task(1, "arithmetic")
    assert record["trace_id"] in traces
    message = record["message"]
    assert isinstance(message, dict)
    assert (message["type"], message["id"]) == ("task", EXAMPLE_TASK)
    assert message["metadata"] == {"answer": "42"}
    # The whole path: generator -> validator -> scored stream, once despite the resubmissions.
    async with await TemperClient.connect(up.url) as client:
        [scored] = await client.wait_scored(EXAMPLE_TASK, count=1, timeout_s=120)
        await asyncio.sleep(1.0)
        assert await client.task_progress(EXAMPLE_TASK) == 1
    assert scored.rollout.status is RolloutStatus.OK
    assert scored.rollout.engine == "torch"
    assert scored.status is ScoreStatus.SCORED
    assert scored.rollout.task.domain == "arithmetic"

    up.proc.send_signal(signal.SIGINT)
    tail = await up.rest()
    assert up.proc.returncode == 0, "".join(up.lines)
    assert re.search(r"stopping control", tail)
    assert tail.rstrip().endswith("nats-server stopped")
    assert not alive(nats_pid)
    assert not alive(control_pid)


async def test_a_killed_service_is_restarted(ups: list[Up], tmp_path: Path) -> None:
    up, nats_pid, control_pid = await stack(ups, tmp_path, "--service", "control")
    os.kill(control_pid, signal.SIGKILL)
    await up.line(rf"control\s+exited with -{signal.SIGKILL.value} after [\d.]+s; restart in")
    restarted = await up.line(r"control\s+started \(pid (\d+)")
    new_pid = int(restarted[1])
    assert new_pid != control_pid
    assert not alive(control_pid)

    async with asyncio.timeout(20):
        while True:
            check = await temper(up.url, "check", "control", "--timeout", "1")
            if check.code == 0:
                break
            await asyncio.sleep(0.1)
    assert f"instance {socket.gethostname()}-{new_pid})" in check.out  # the new process

    up.proc.send_signal(signal.SIGTERM)  # as a process manager stops it: same as Ctrl-C
    await up.rest()
    assert up.proc.returncode == 0
    await wait_gone([nats_pid, new_pid], timeout_s=1)


async def status_once_healthy(url: str, timeout_s: float = 20.0) -> StackStatus:
    """``temper status --json`` once it answers with every service healthy."""
    async with asyncio.timeout(timeout_s):
        while True:
            done = await temper(url, "status", "--json", "--timeout", "1")
            if done.code == 0:
                return msgspec.json.decode(done.out, type=StackStatus)
            await asyncio.sleep(0.2)


async def test_a_killed_nats_server_comes_back_on_its_port_and_store(
    ups: list[Up], tmp_path: Path
) -> None:
    up, nats_pid, control_pid = await stack(ups, tmp_path, "--service", "control")
    task = Task(id="kept-1", domain="math", prompt=[ChatMessage(role="user", content="x")])
    async with await TemperClient.connect(up.url) as client:
        receipt = await client.submit(task)

    os.kill(nats_pid, signal.SIGKILL)
    await up.line(rf"nats-server\s+exited with -{signal.SIGKILL.value} after [\d.]+s; restart in")
    restarted = await up.line(NATS_STARTED)
    assert restarted["url"] == up.url  # the same port
    new_pid = int(restarted["pid"])
    assert new_pid != nats_pid and alive(new_pid)
    assert command_line(new_pid).endswith(str(tmp_path / "run" / "nats" / "nats.conf"))

    # The control service rode through (same process, reconnected) and reads the streams
    # from the same store: the task stored before the crash is still there.
    status = await status_once_healthy(up.url)
    [control] = [s for s in status.services if s.service == "control"]
    assert control.instance == f"{socket.gethostname()}-{control_pid}"
    [stream] = [s for s in status.streams if s.name == receipt.stream]
    assert stream.messages == 1
    assert alive(control_pid)
    assert not any(re.search(r"control\s+exited", line) for line in up.lines)

    up.proc.send_signal(signal.SIGTERM)
    tail = await up.rest()
    assert up.proc.returncode == 0
    assert tail.rstrip().endswith("nats-server stopped")
    await wait_gone([new_pid, control_pid], timeout_s=1)


async def said(lines: list[str], pattern: str, count: int = 1, timeout_s: float = 10.0) -> None:
    """Wait until ``count`` of the supervisor's lines match ``pattern``."""
    async with asyncio.timeout(timeout_s):
        while sum(bool(re.search(pattern, line)) for line in lines) < count:
            await asyncio.sleep(0.02)


async def take_port(sock: socket.socket, port: int, timeout_s: float = 5.0) -> None:
    """Listen on ``port`` as soon as it is free."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                sock.bind(("127.0.0.1", port))
                break
            except OSError:
                await asyncio.sleep(0.01)
    sock.listen()


async def test_nats_server_restarts_back_off_until_its_port_is_free(tmp_path: Path) -> None:
    port = free_port()
    settings = StackSettings(
        run_dir=tmp_path / "run", nats_port=port, restart_backoff_s=0.2, max_backoff_s=0.4
    )
    lines: list[str] = []
    supervisor = Supervisor(settings, say=lines.append)
    stop = asyncio.Event()
    await supervisor.start()
    watcher = asyncio.create_task(supervisor.watch(stop))
    started = rf"^nats-server  nats://127\.0\.0\.1:{port}  \(pid (\d+)\)$"
    try:
        [first] = [int(m[1]) for line in lines if (m := re.match(started, line))]
        with socket.socket() as squatter:
            os.kill(first, signal.SIGKILL)
            await take_port(squatter, port)
            await said(lines, rf"^nats-server  exited with -{signal.SIGKILL.value} after ")
            await said(lines, r"^nats-server  did not start \(nats-server exited with 1; see ")
        await said(lines, started, count=2)
        assert supervisor.nats_server.restarts >= 2
        async with await TemperClient.connect(supervisor.nats_url) as client:
            assert await client.ping(timeout_s=0.2) == []  # answering again, on the same port
    finally:
        stop.set()
        await watcher
        await supervisor.stop()
    assert lines[-1] == "nats-server stopped"


async def test_killing_up_leaves_nothing_behind(ups: list[Up], tmp_path: Path) -> None:
    up, nats_pid, control_pid = await stack(ups, tmp_path, "--service", "control")
    up.proc.kill()
    await up.proc.wait()
    # The kernel sends SIGTERM to every child of a dead supervisor (parent-death signal).
    await wait_gone([nats_pid], timeout_s=5)
    await wait_gone([control_pid], timeout_s=10)


async def test_terminal_ctrl_c_stops_the_services_before_nats_server(
    ups: list[Up], tmp_path: Path
) -> None:
    # A terminal's Ctrl-C goes to the whole foreground process group, not only to `temper up`.
    up, nats_pid, control_pid = await stack(ups, tmp_path, "--service", "control", new_session=True)
    os.killpg(up.proc.pid, signal.SIGINT)
    await wait_gone([nats_pid], timeout_s=15)
    # nats-server goes last: by the time it is gone every service has stopped.
    assert not alive(control_pid)
    nats_log = (tmp_path / "run" / "nats" / "nats-server.log").read_text()
    assert 'Trapped "interrupt" signal' not in nats_log
    await up.rest()
    assert up.proc.returncode == 0
    control_log = (tmp_path / "run" / "logs" / "control.log").read_text()
    assert "service_stopped" in control_log
    assert "Traceback" not in control_log


async def test_up_on_a_busy_port_fails_cleanly(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done: Done = await temper(
            f"nats://127.0.0.1:{port}",
            "up",
            "--run-dir",
            str(tmp_path / "run"),
            "--nats-port",
            str(port),
        )
    assert done.code == 1
    assert "temper: nats-server exited with" in done.out + done.err
    assert "Traceback" not in done.err
