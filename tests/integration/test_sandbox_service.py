"""The sandbox service through NATS, on the real Docker engine (and on the local backends).

Docker tests skip without an engine, unless TEMPER_REQUIRE_DOCKER=1 (CI), where they fail.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiodocker
import pytest
from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.errors import ErrorCode
from protocol.messages import (
    ErrorReply,
    Message,
    SandboxClose,
    SandboxExec,
    SandboxLimits,
    SandboxOpen,
    SandboxResult,
    SandboxSession,
    SandboxSnapshot,
    SandboxSnapshotRequest,
    SandboxStatus,
)
from services.runtime.settings import RuntimeSettings
from services.sandbox.docker_backend import LABEL, OWNER_LABEL
from services.sandbox.service import SandboxService
from services.sandbox.settings import Limits, SandboxSettings
from tests.integration.support import client

REPLIES: Codec[SandboxResult | SandboxSession | SandboxSnapshot | ErrorReply] = Codec(
    SandboxResult | SandboxSession | SandboxSnapshot | ErrorReply
)


def settings(
    url: str, tmp: Path, backend: str, image: str = "", **overrides: object
) -> SandboxSettings:
    values: dict[str, object] = {
        "runtime": RuntimeSettings(nats_url=url, heartbeat_s=0.2, grace_s=5, instance="sbx-test"),
        "backend": backend,
        "pool_size": 2,
        # AF_UNIX paths are short: keep the sockets out of pytest's long tmp paths.
        "state_dir": Path(tempfile.mkdtemp(prefix="tsb-")),
        "snapshot_dir": tmp / "snapshots",
        "defaults": Limits(timeout_s=5.0, memory_mb=128, pids=64, output_bytes=65536, disk_mb=16),
        "session_ttl_s": 30.0,
    }
    if image:
        values["image"] = image
    values.update(overrides)
    return SandboxSettings(**values)  # type: ignore[arg-type]


async def ask(
    nc: NATS, message: Message, subject: str | None = None, timeout_s: float = 30
) -> object:
    reply = await nc.request(subject or subjects.sandbox_exec(), encode(message), timeout=timeout_s)
    return REPLIES.decode(reply.data)


async def run(nc: NATS, code: str, **fields: object) -> SandboxResult:
    result = await ask(nc, SandboxExec(id="t", code=code, **fields))  # type: ignore[arg-type]
    assert isinstance(result, SandboxResult), result
    return result


async def wait_warm(service: SandboxService, count: int, timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s):
        while service.backend.statistics()["pool_idle"] < count:
            await asyncio.sleep(0.05)


@pytest.fixture
async def docker_sandbox(
    nats_url: str, tmp_path: Path, sandbox_image: str
) -> AsyncIterator[tuple[SandboxService, NATS]]:
    service = SandboxService(settings(nats_url, tmp_path, "docker", sandbox_image))
    async with service, client(nats_url) as nc:
        await wait_warm(service, 2)
        yield service, nc


async def test_runs_python_and_bash_as_the_sandbox_user(
    docker_sandbox: tuple[SandboxService, NATS],
) -> None:
    _, nc = docker_sandbox
    ok = await run(nc, "import os, sys; print(os.getuid(), sys.stdin.read())", stdin=b"hi")
    assert (ok.status, ok.exit_code, ok.stdout) == (SandboxStatus.OK, 0, "10001 hi\n")
    bash = await run(nc, "echo $((6*7)) >&2; exit 3", language="bash")
    assert (bash.status, bash.exit_code, bash.stderr) == (SandboxStatus.NONZERO_EXIT, 3, "42\n")


async def test_files_are_written_and_each_task_gets_a_clean_workdir(
    docker_sandbox: tuple[SandboxService, NATS],
) -> None:
    _, nc = docker_sandbox
    wrote = await run(nc, "print(open('data/in.txt').read())", files={"data/in.txt": b"payload"})
    assert wrote.stdout == "payload\n"
    for _ in range(3):  # whichever container comes next, the file is gone
        later = await run(nc, "import os; print(sorted(os.listdir('.')))")
        assert later.stdout == "[]\n"


async def test_timeout_and_oom_are_typed_and_the_pool_recovers(
    docker_sandbox: tuple[SandboxService, NATS],
) -> None:
    service, nc = docker_sandbox
    slow = await run(nc, "while True: pass", limits=SandboxLimits(timeout_s=0.5))
    assert slow.status is SandboxStatus.TIMEOUT
    hog = await run(nc, "x = bytearray(1 << 30)")
    assert hog.status is SandboxStatus.OOM
    await wait_warm(service, 2)
    assert service.backend.statistics()["sandboxes_recycled"] >= 2  # both were replaced
    assert (await run(nc, "print('fine')")).stdout == "fine\n"


async def test_bad_requests_get_typed_errors(docker_sandbox: tuple[SandboxService, NATS]) -> None:
    service, nc = docker_sandbox
    cases = [
        (SandboxExec(id="a", language="cobol", code="x"), ErrorCode.BAD_REQUEST, "$.language"),
        (SandboxExec(id="b", code="x" * (2 << 20)), ErrorCode.TOO_LARGE, "$.code"),
        (
            SandboxExec(id="c", code="x", limits=SandboxLimits(memory_mb=1 << 20)),
            ErrorCode.BAD_REQUEST,
            "$.limits.memory_mb",
        ),
        (SandboxExec(id="d", code="x", files={"../escape": b""}), ErrorCode.BAD_REQUEST, "$.files"),
        (SandboxExec(id="e", code="x", session="nope"), ErrorCode.BAD_REQUEST, "$.session"),
    ]
    for request, code, field in cases:
        reply = await ask(nc, request)
        assert isinstance(reply, ErrorReply), request
        assert (reply.code, reply.field) == (code, field)
    garbage = await nc.request(subjects.sandbox_exec(), b"\xc1 not msgpack", timeout=5)
    assert REPLIES.decode(garbage.data).code is ErrorCode.NOT_MSGPACK  # type: ignore[union-attr]
    assert (await run(nc, "print(1)")).status is SandboxStatus.OK
    assert not service.crashed.is_set()


async def test_a_session_keeps_its_sandbox_until_closed(
    docker_sandbox: tuple[SandboxService, NATS],
) -> None:
    _, nc = docker_sandbox
    opened = await ask(
        nc, SandboxOpen(id="o", files={"state.txt": b"0"}), subjects.sandbox_session()
    )
    assert isinstance(opened, SandboxSession) and opened.state == "open"
    step = "n = int(open('state.txt').read()) + 1; open('state.txt', 'w').write(str(n)); print(n)"
    outputs = []
    for _ in range(3):
        result = await ask(
            nc, SandboxExec(id="s", session=opened.session, code=step), opened.subject
        )
        assert isinstance(result, SandboxResult)
        outputs.append(result.stdout)
    assert outputs == ["1\n", "2\n", "3\n"]
    closed = await ask(nc, SandboxClose(session=opened.session), opened.subject)
    assert isinstance(closed, SandboxSession) and closed.state == "closed"
    gone = await ask(nc, SandboxExec(id="s", session=opened.session, code=step), opened.subject)
    assert isinstance(gone, ErrorReply) and gone.field == "$.session"


async def session_run(nc: NATS, opened: SandboxSession, script: str) -> str:
    result = await ask(
        nc,
        SandboxExec(id="s", session=opened.session, language="bash", code=script),
        opened.subject,
    )
    assert isinstance(result, SandboxResult) and result.status is SandboxStatus.OK, result
    return result.stdout


async def open_session(nc: NATS, **fields: object) -> SandboxSession:
    opened = await ask(nc, SandboxOpen(id="o", **fields), subjects.sandbox_session())  # type: ignore[arg-type]
    assert isinstance(opened, SandboxSession), opened
    return opened


async def test_a_checker_session_is_a_fresh_sandbox_of_a_user_the_code_never_was(
    docker_sandbox: tuple[SandboxService, NATS],
) -> None:
    service, nc = docker_sandbox
    policy = await open_session(nc)
    mine = await session_run(
        nc, policy, "id -u > mine.txt; (setsid sleep 300 >/dev/null 2>&1 &); hostname"
    )
    saved = await ask(nc, SandboxSnapshotRequest(session=policy.session), policy.subject)
    assert isinstance(saved, SandboxSnapshot)
    await ask(nc, SandboxClose(session=policy.session), policy.subject)
    hosts = {mine.strip()}
    checker_hosts = []
    for _ in range(3):  # more than the warm checkers: a reused one would be met
        checker = await open_session(nc, snapshot=saved.snapshot, checker=True)
        seen = await session_run(
            nc, checker, "id -u; cat mine.txt; hostname; ps -eo uid= | sort -u"
        )
        uid, policy_uid, host, *uids = seen.split()
        # The policy's files come over, its uid and its processes do not.
        assert (uid, policy_uid) == ("10002", "10001") and uids == ["10002"], seen
        assert host not in hosts, "a checker got a sandbox code had run in"
        hosts.add(host)
        checker_hosts.append(host)
        await ask(nc, SandboxClose(session=checker.session), checker.subject)
    # Once asked for, checkers are kept warm; the code's sessions never get one.
    async with asyncio.timeout(60):
        while service.backend.statistics()["checker_idle"] < 1:
            await asyncio.sleep(0.05)
    for _ in range(3):
        plain = await open_session(nc)
        assert (await session_run(nc, plain, "hostname")).strip() not in checker_hosts
        await ask(nc, SandboxClose(session=plain.session), plain.subject)


async def test_an_abandoned_session_is_reclaimed(
    nats_url: str, tmp_path: Path, sandbox_image: str
) -> None:
    service = SandboxService(
        settings(nats_url, tmp_path, "docker", sandbox_image, session_ttl_s=0.5)
    )
    async with service, client(nats_url) as nc:
        opened = await ask(nc, SandboxOpen(id="o", ttl_s=0.5), subjects.sandbox_session())
        assert isinstance(opened, SandboxSession)
        async with asyncio.timeout(10):
            while service.statistics()["sessions"]:
                await asyncio.sleep(0.1)
        late = await ask(nc, SandboxExec(id="s", session=opened.session, code="1"), opened.subject)
        assert isinstance(late, ErrorReply)


async def test_leftovers_of_a_dead_owner_are_reaped(
    nats_url: str, tmp_path: Path, sandbox_image: str
) -> None:
    async with aiodocker.Docker() as docker:
        orphan = await docker.containers.create(
            {
                "Image": sandbox_image,
                "Cmd": ["sleep", "600"],
                "NetworkDisabled": True,
                "HostConfig": {"NetworkMode": "none"},
                "Labels": {LABEL: "1", OWNER_LABEL: f"{os.uname().nodename}:{_dead_pid()}"},
            },
        )
        await orphan.start()
        service = SandboxService(settings(nats_url, tmp_path, "docker", sandbox_image))
        async with service:
            with pytest.raises(aiodocker.exceptions.DockerError):
                await docker.containers.get(orphan.id)
        left = await docker.containers.list(all=True, filters={"label": [f"{OWNER_LABEL}={_me()}"]})
        assert left == []  # and stopping the service removed its own containers


async def test_a_vanished_container_is_an_infra_error(
    docker_sandbox: tuple[SandboxService, NATS],
) -> None:
    service, nc = docker_sandbox
    pending = asyncio.ensure_future(run(nc, "import time; time.sleep(30)"))
    async with asyncio.timeout(10):
        while not service.backend.statistics().get("sandboxes"):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
    busy = [b for b in service.backend._boxes.values() if b.uses]  # type: ignore[attr-defined]
    assert len(busy) == 1
    async with aiodocker.Docker() as docker:
        await docker.containers.container(busy[0].id).delete(force=True)
    result = await pending
    assert result.status is SandboxStatus.INFRA_ERROR
    await wait_warm(service, 2)
    assert (await run(nc, "print(2)")).stdout == "2\n"


async def test_an_idle_sandbox_that_died_is_skipped(
    nats_url: str, tmp_path: Path, sandbox_image: str
) -> None:
    # No health sweep here: acquiring sees the dead agent's closed connection by itself.
    service = SandboxService(
        settings(nats_url, tmp_path, "docker", sandbox_image, health_interval_s=0)
    )
    async with service, client(nats_url) as nc:
        await wait_warm(service, 2)
        dead = next(iter(service.backend._boxes.values()))  # type: ignore[attr-defined]
        async with aiodocker.Docker() as docker:
            await docker.containers.container(dead.id).kill()
        await asyncio.sleep(0.3)  # the kernel closes its socket; the loop reads the EOF
        for _ in range(4):  # each of them would have met the dead one without the check
            result = await run(nc, "print(3)")
            assert (result.status, result.stdout) == (SandboxStatus.OK, "3\n"), result
        await wait_warm(service, 2)
        assert dead.id not in service.backend._boxes  # type: ignore[attr-defined]


async def test_the_health_sweep_replaces_dead_and_hung_idle_sandboxes(
    nats_url: str, tmp_path: Path, sandbox_image: str
) -> None:
    service = SandboxService(
        settings(nats_url, tmp_path, "docker", sandbox_image, health_interval_s=0.2)
    )
    async with service, client(nats_url) as nc:
        await wait_warm(service, 2)
        killed, frozen = list(service.backend._boxes.values())  # type: ignore[attr-defined]
        async with aiodocker.Docker() as docker:
            await docker.containers.container(killed.id).kill()  # its agent hangs up
            await docker.containers.container(frozen.id).pause()  # only a ping tells
            async with asyncio.timeout(30):
                while {killed.id, frozen.id} & set(service.backend._boxes):  # type: ignore[attr-defined]
                    await asyncio.sleep(0.05)
            gone = await docker.containers.list(all=True, filters={"id": [killed.id, frozen.id]})
            assert gone == []
        await wait_warm(service, 2)
        assert service.backend.statistics()["sandboxes_recycled"] == 2
        result = await run(nc, "print(4)")
        assert (result.status, result.stdout) == (SandboxStatus.OK, "4\n"), result


@pytest.mark.parametrize("backend", ["bwrap", "subprocess"])
async def test_local_backends_serve_the_same_api(
    nats_url: str, tmp_path: Path, backend: str
) -> None:
    service = SandboxService(settings(nats_url, tmp_path, backend))
    async with service, client(nats_url) as nc:
        ok = await run(nc, "print(sum(range(10)))")
        assert (ok.status, ok.stdout) == (SandboxStatus.OK, "45\n")
        slow = await run(nc, "import time; time.sleep(30)", limits=SandboxLimits(timeout_s=0.3))
        assert slow.status is SandboxStatus.TIMEOUT
        assert (await run(nc, "echo ok", language="bash")).stdout == "ok\n"
        if backend == "bwrap":  # the agent is its namespace's init, as in a container
            assert (await run(nc, "import os; print(os.getppid())")).stdout == "1\n"
        # No cgroup of their own: runs keep the agent's priority (not a container's 19).
        assert (await run(nc, "import os; print(os.nice(0))")).stdout == f"{os.nice(0)}\n"


def _dead_pid() -> int:
    pid = 2**22 - 7
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        pid -= 1


def _me() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


async def test_a_snapshot_restores_a_session_elsewhere(
    docker_sandbox: tuple[SandboxService, NATS],
) -> None:
    _, nc = docker_sandbox
    opened = await ask(nc, SandboxOpen(id="o"), subjects.sandbox_session())
    assert isinstance(opened, SandboxSession)
    step = "open('progress.txt', 'a').write('step\\n')"
    await ask(nc, SandboxExec(id="1", session=opened.session, code=step), opened.subject)
    snap = await ask(nc, SandboxSnapshotRequest(session=opened.session), opened.subject)
    assert isinstance(snap, SandboxSnapshot) and snap.digest.startswith("sha256:")
    await ask(nc, SandboxExec(id="2", session=opened.session, code="1/0"), opened.subject)
    await ask(nc, SandboxClose(session=opened.session), opened.subject)

    resumed = await ask(nc, SandboxOpen(id="r", snapshot=snap.snapshot), subjects.sandbox_session())
    assert isinstance(resumed, SandboxSession) and resumed.snapshot == snap.snapshot
    assert resumed.session != opened.session
    read = "print(open('progress.txt').read(), end='')"
    result = await ask(nc, SandboxExec(id="3", session=resumed.session, code=read), resumed.subject)
    assert isinstance(result, SandboxResult) and result.stdout == "step\n"

    missing = await ask(nc, SandboxOpen(id="m", snapshot="f" * 32), subjects.sandbox_session())
    assert isinstance(missing, ErrorReply) and missing.field == "$.snapshot"


async def test_c_is_compiled_and_run(docker_sandbox: tuple[SandboxService, NATS]) -> None:
    _, nc = docker_sandbox
    code = (
        "#include <stdio.h>\n#include <math.h>\n"
        'int main(void) { printf("%.4f\\n", sqrt(2.0)); return 0; }\n'
    )
    result = await run(nc, code, language="c")
    assert (result.status, result.stdout) == (SandboxStatus.OK, "1.4142\n"), result
    broken = await run(nc, "int main( {", language="c")
    assert broken.status is SandboxStatus.NONZERO_EXIT and "error" in broken.stderr, broken


async def test_a_program_built_in_the_workdir_can_run(
    docker_sandbox: tuple[SandboxService, NATS],
) -> None:
    """What a compiled language needs: an executable written to /work runs (setuid stays inert)."""
    _, nc = docker_sandbox
    script = "printf '#!/bin/sh\\necho built\\n' > prog && chmod +x prog && ./prog"
    result = await run(nc, script, language="bash")
    assert (result.status, result.stdout) == (SandboxStatus.OK, "built\n")


CPP_HELLO = '#include <iostream>\nint main() { std::cout << "hello " << 6 * 7 << "\\n"; }\n'


@pytest.mark.parametrize(
    ("language", "hello", "broken", "message"),
    [
        ("cpp", CPP_HELLO, "int main() { return nope; }", "was not declared in this scope"),
        ("js", "console.log('hello ' + 6 * 7);", "console.log(;", "SyntaxError"),
    ],
)
async def test_compiled_and_script_languages_run_and_report_their_errors(
    docker_sandbox: tuple[SandboxService, NATS],
    language: str,
    hello: str,
    broken: str,
    message: str,
) -> None:
    _, nc = docker_sandbox
    result = await run(nc, hello, language=language)
    assert (result.status, result.stdout) == (SandboxStatus.OK, "hello 42\n"), result
    failed = await run(nc, broken, language=language)
    assert (failed.status, failed.exit_code) == (SandboxStatus.NONZERO_EXIT, 1), failed
    assert message in failed.stderr and failed.stdout == ""


def stl_vertices(stl: bytes) -> list[tuple[float, ...]]:
    """The vertices of an ASCII STL's facets, three per facet."""
    rows = [line.split() for line in stl.decode().splitlines()]
    return [tuple(float(v) for v in row[1:]) for row in rows if row[:1] == ["vertex"]]


async def test_openscad_renders_a_part_to_an_stl_that_comes_back(
    docker_sandbox: tuple[SandboxService, NATS],
) -> None:
    _, nc = docker_sandbox
    part = "difference() { cube([10, 20, 30]); translate([5, 10, -1]) cylinder(h=40, r=2); }"
    result = await run(nc, part, language="openscad", outputs=["out.stl", "missing.stl"])
    assert result.status is SandboxStatus.OK, result
    assert "Top level object is a 3D object" in result.stderr  # the toolchain's own report
    assert set(result.outputs) == {"out.stl"}
    vertices = stl_vertices(result.outputs["out.stl"])
    assert len(vertices) % 3 == 0 and len(vertices) > 12 * 3  # more than a bare cube
    lows = [min(v[i] for v in vertices) for i in range(3)]
    highs = [max(v[i] for v in vertices) for i in range(3)]
    assert (lows, highs) == ([0, 0, 0], [10, 20, 30])
    broken = await run(nc, "cube([1, 2;", language="openscad", outputs=["out.stl"])
    assert (broken.status, broken.exit_code) == (SandboxStatus.NONZERO_EXIT, 1), broken
    assert "Parser error" in broken.stderr and broken.outputs == {}


async def container_limits(service: SandboxService, session: str) -> tuple[int, int]:
    """(memory in MiB, pids) of the container that holds a session."""
    box = service._sessions[session].box
    async with aiodocker.Docker() as docker:
        info = await docker.containers.container(box.id).show()
    host = info["HostConfig"]
    return host["Memory"] >> 20, host["PidsLimit"]


async def test_language_limits_come_from_the_table_then_the_request_within_the_maxima(
    docker_sandbox: tuple[SandboxService, NATS],
) -> None:
    service, nc = docker_sandbox
    cases = [
        ("python", SandboxLimits(), (128, 64)),  # the service's defaults
        ("cpp", SandboxLimits(), (2048, 256)),  # the language's own
        ("cpp", SandboxLimits(memory_mb=700, pids=100), (700, 100)),  # a domain's config
    ]
    for language, limits, expected in cases:
        opened = await ask(
            nc, SandboxOpen(id="o", language=language, limits=limits), subjects.sandbox_session()
        )
        assert isinstance(opened, SandboxSession), opened
        assert await container_limits(service, opened.session) == expected, language
        await ask(nc, SandboxClose(session=opened.session), opened.subject)
    over = await ask(
        nc, SandboxExec(id="x", language="cpp", code="", limits=SandboxLimits(pids=5000))
    )
    assert isinstance(over, ErrorReply)
    assert (over.code, over.field) == (ErrorCode.BAD_REQUEST, "$.limits.pids")
    assert "above this service's maximum 1024" in over.message
