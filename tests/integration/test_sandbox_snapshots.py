"""Snapshots at the agent level (archive / extract) and the snapshot store, no Docker."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from protocol.errors import ErrorCode
from services.runtime.errors import RequestRejected
from services.sandbox.agent_client import AgentClient, AgentRejected
from services.sandbox.snapshots import SnapshotStore
from tests.integration.test_sandbox_agent import RunningAgent, run


async def test_archive_then_extract_restores_the_workdir(
    client: AgentClient, agent: RunningAgent
) -> None:
    await run(
        client,
        code="import os; os.makedirs('d/e'); open('d/e/f.txt','w').write('deep'); "
        "open('top.txt','w').write('top'); os.makedirs('empty')",
    )
    os.symlink("/etc/passwd", agent.workdir / "link")
    data = await client.archive(timeout_s=5)
    await client.reset(timeout_s=5)
    assert os.listdir(agent.workdir) == []
    (agent.workdir / "stale.txt").write_text("replaced")
    assert await client.extract(data, timeout_s=5) == 2
    # The link comes back as a link (never followed), the stale file is gone.
    assert sorted(os.listdir(agent.workdir)) == ["d", "empty", "link", "top.txt"]
    assert os.readlink(agent.workdir / "link") == "/etc/passwd"
    assert (agent.workdir / "d" / "e" / "f.txt").read_text() == "deep"
    reply = await run(client, code="print(open('top.txt').read())")
    assert reply.stdout == b"top\n"


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, content in members:
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if info.isfile() else None)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "hostile",
    [
        (tarfile.TarInfo("../escape.txt"), b"x"),
        (tarfile.TarInfo("/etc/owned"), b"x"),
    ],
)
async def test_extract_refuses_paths_leaving_the_workdir(
    client: AgentClient, agent: RunningAgent, hostile: tuple[tarfile.TarInfo, bytes]
) -> None:
    (agent.workdir / "keep.txt").write_text("kept")
    with pytest.raises(AgentRejected):
        await client.extract(_tar((tarfile.TarInfo("ok.txt"), b"fine"), hostile), timeout_s=5)
    assert sorted(os.listdir(agent.workdir)) == ["keep.txt"]  # nothing written, nothing wiped
    assert not (agent.workdir.parent / "escape.txt").exists()


async def test_extract_refuses_devices_hard_links_and_garbage(client: AgentClient) -> None:
    for kind in (tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE):
        member = tarfile.TarInfo("odd")
        member.type = kind
        member.linkname = "/etc/passwd"
        with pytest.raises(AgentRejected):
            await client.extract(_tar((member, b"")), timeout_s=5)
    with pytest.raises(AgentRejected):
        await client.extract(b"not a tar at all", timeout_s=5)
    assert (await run(client, code="print(1)")).stdout == b"1\n"  # still serving


async def test_modes_code_took_away_survive_a_snapshot(
    client: AgentClient, agent: RunningAgent
) -> None:
    """``chmod 000`` on the workdir, a folder and a file: the archive still reads them
    (the agent owns them), puts the modes back, and extract restores them."""
    await run(
        client,
        code="import os; os.makedirs('shut'); open('shut/in.txt','w').write('inside'); "
        "open('key','w').write('k'); os.chmod('key', 0o600); open('run.sh','w').write('x'); "
        "os.chmod('run.sh', 0o755); os.chmod('shut/in.txt', 0); os.chmod('shut', 0); "
        "os.chmod('.', 0)",
    )
    data = await client.archive(timeout_s=5)
    assert os.stat(agent.workdir / "shut").st_mode & 0o777 == 0  # left as code left it
    await client.reset(timeout_s=5)
    assert await client.extract(data, timeout_s=5) == 3
    modes = {n: os.stat(agent.workdir / n).st_mode & 0o777 for n in ("shut", "key", "run.sh")}
    assert modes == {"shut": 0, "key": 0o600, "run.sh": 0o755}
    os.chmod(agent.workdir / "shut", 0o700)
    assert os.stat(agent.workdir / "shut" / "in.txt").st_mode & 0o777 == 0
    os.chmod(agent.workdir / "shut" / "in.txt", 0o600)
    assert (agent.workdir / "shut" / "in.txt").read_text() == "inside"


async def test_store_saves_whole_files_with_a_digest(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    saved = await store.save("sess-1", b"archive bytes")
    assert saved.size == 13 and saved.digest.startswith("sha256:") and saved.session == "sess-1"
    assert await store.load(saved.snapshot) == b"archive bytes"
    assert [p.name for p in (tmp_path / "snaps").iterdir()] == [f"{saved.snapshot}.tar.gz"]
    for bad in ("0" * 32, "../../etc/passwd", ""):
        with pytest.raises(RequestRejected) as caught:
            await store.load(bad)
        assert (caught.value.code, caught.value.field) == (ErrorCode.BAD_REQUEST, "$.snapshot")


async def test_old_snapshots_are_pruned_when_a_new_one_is_saved(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, ttl_s=3600.0)
    old = await store.save("s1", b"old")
    kept = await store.save("s2", b"kept")
    stale = tmp_path / f"{old.snapshot}.tar.gz"
    os.utime(stale, (1.0, 1.0))  # saved long ago
    store._pruned_at = float("-inf")  # the next save is due to prune
    new = await store.save("s3", b"new")
    assert not stale.exists()
    assert await store.load(kept.snapshot) == b"kept" and await store.load(new.snapshot) == b"new"
    with pytest.raises(RequestRejected, match="unknown snapshot"):
        await store.load(old.snapshot)
