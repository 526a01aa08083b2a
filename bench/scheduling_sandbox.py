"""What a preemption costs with a real sandbox session: the snapshot a preempted
trajectory saves and the restore its resumption pays, set against a plain tool turn.

A real nats-server, sandbox service (Docker, the offline-built image) and the
generator's ``SandboxTools``: each round opens a session on a small repository
(``FILES`` files), runs tool turns, saves a snapshot, closes the session, opens a new
one from the snapshot and runs its first turn there, as a resumed trajectory does.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats
from bench_sandbox import build_image

from services.generator.tools import SandboxTools, ToolSession
from services.model.tool_format import ToolCallRequest
from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from services.runtime.settings import RuntimeSettings
from services.sandbox.service import SandboxService
from services.sandbox.settings import SandboxSettings

#: The repository a session works on: files of a small project, about 100 KB.
FILES = 30
FILE_BYTES = 3_000
TURN = "echo turn >> work.log && ls | wc -l"
CHECK = "wc -l < work.log"


@dataclass(kw_only=True)
class SnapshotFigures:
    image: str = ""
    #: Why nothing was measured, if nothing was.
    skipped: str = ""
    #: A tool turn in an open session.
    turn_s: list[float] = field(default_factory=list)
    #: The first turn of a session opened on the task's files (a fresh trajectory).
    fresh_s: list[float] = field(default_factory=list)
    save_s: list[float] = field(default_factory=list)
    #: The first turn of a session opened from the snapshot (a resumed trajectory).
    restore_s: list[float] = field(default_factory=list)
    #: Whether every restored session found the work of the saved one.
    intact: bool = True


def repository() -> dict[str, bytes]:
    return {f"src/module_{i:02d}.py": bytes([97 + i % 26]) * FILE_BYTES for i in range(FILES)}


def bash(code: str) -> ToolCallRequest:
    return ToolCallRequest(name="bash", arguments={"code": code}, raw="")


async def timed_turn(session: ToolSession, code: str = TURN) -> tuple[float, str]:
    started = time.perf_counter()
    outcome = await session.call(bash(code))
    return time.perf_counter() - started, outcome.output.strip()


async def one_round(tools: SandboxTools, index: int, fig: SnapshotFigures) -> None:
    session = await tools.open(f"snap-{index}", ("bash",), files=repository())
    fresh_s, _ = await timed_turn(session)
    fig.fresh_s.append(fresh_s)
    for _ in range(3):
        turn_s, _ = await timed_turn(session)
        fig.turn_s.append(turn_s)
    started = time.perf_counter()
    snapshot = await session.snapshot()
    fig.save_s.append(time.perf_counter() - started)
    await session.close()
    resumed = await tools.open(f"snap-{index}", ("bash",), snapshot=snapshot)
    try:
        restore_s, lines = await timed_turn(resumed, CHECK)
    finally:
        await resumed.close()
    fig.restore_s.append(restore_s)
    fig.intact = fig.intact and lines == "4"


async def measure(rounds: int) -> SnapshotFigures:
    image, why = build_image()
    if image is None:
        return SnapshotFigures(skipped=why)
    fig = SnapshotFigures(image=image)
    with tempfile.TemporaryDirectory(prefix="temper-bench-snap-") as tmp:
        server = NatsServer(NatsServerSettings(store_dir=Path(tmp) / "nats", port=RANDOM_PORT))
        server.start()
        try:
            async with SandboxService(_settings(server.url, image, Path(tmp))):
                nc = await nats.connect(server.url)
                try:
                    tools = SandboxTools(nc, timeout_s=60)
                    for index in range(rounds):
                        await one_round(tools, index, fig)
                finally:
                    await nc.close()
        finally:
            server.stop()
    return fig


def _settings(url: str, image: str, tmp: Path) -> SandboxSettings:
    return SandboxSettings(
        runtime=RuntimeSettings(nats_url=url, instance="bench-snapshots", stats_s=60, grace_s=5),
        backend="docker",
        image=image,
        pool_size=1,
        # AF_UNIX paths are short: the sockets go to a short directory of their own.
        state_dir=Path(tempfile.mkdtemp(prefix="tbs-")),
        snapshot_dir=tmp / "snapshots",
    )


def render(fig: SnapshotFigures) -> list[str]:
    if fig.skipped:
        return [f"  real sandbox snapshot: not measured ({fig.skipped})"]

    def ms(values: list[float]) -> str:
        return f"p50 {statistics.median(values) * 1e3:.0f} ms (max {max(values) * 1e3:.0f})"

    turn = statistics.median(fig.turn_s)
    cost = statistics.median(fig.save_s) + statistics.median(fig.restore_s) - turn
    return [
        f"  real sandbox session ({fig.image}, {FILES} files, "
        f"{FILES * FILE_BYTES // 1000} KB; {len(fig.save_s)} rounds):",
        f"    save {ms(fig.save_s)}; restore (first turn from the snapshot) {ms(fig.restore_s)}",
        f"    vs a plain tool turn {ms(fig.turn_s)}, a fresh session's first turn "
        f"{ms(fig.fresh_s)}",
        f"    preemption overhead per trajectory: {cost * 1e3:.0f} ms "
        f"({cost / turn:.1f} plain tool turns); work intact after restore: "
        f"{'yes' if fig.intact else 'NO'}",
    ]
