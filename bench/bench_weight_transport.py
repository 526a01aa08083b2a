"""Weight publication by disk vs by torch.distributed broadcast, into a real CPU SGLang server.

Every round writes a new policy version the way the learner does
(``services.model.weights.write_weights``: safetensors in memory, digest, one write) from
the model with its weights nudged, announces it on a real nats-server (loopback) and stops
the clock when the generator service's WeightSyncAck arrives, which it sends once the
server serves the version.  The two transports alternate, disk first, after one untimed
warm-up of each (the distributed warm-up opens the process group; its cost is printed):

- disk: PolicyUpdate(uri=directory); the generator checks the digest, then the server runs
  pause -> ``/update_weights_from_disk`` -> flush -> continue.
- distributed: the learner's weight server reads the version back into memory (its
  snapshot), the PolicyUpdate names the learner's weight subject; the generator asks for
  the version and the server runs pause -> begin -> ``/update_weights_from_distributed``
  (receiving the learner's gloo broadcast) -> end -> flush -> continue.

The breakdown gives the median of each part: the export (serialize, digest, write), the
snapshot, the generator's digest check, each server call (timed around the HTTP request)
and the learner's broadcast thread (which overlaps the server's receive); "other" is the
rest of the total (NATS round trips, scheduling).  The server is left serving the model's
own weights.  This machine's 2 cores are shared by the server, nats-server and this
process.  Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

import services.generator.service as generator_module
from protocol import subjects
from protocol.codec import Codec, encode
from protocol.messages import PolicyUpdate, WeightSyncAck
from services.engines.sglang.engine import SGLangEngine, SGLangEngineSettings
from services.engines.sglang.server import SGLangServer, SGLangServerSettings, sglang_python
from services.generator.service import GeneratorService
from services.generator.settings import GeneratorSettings
from services.learner.broadcast import BroadcastSettings, WeightServer
from services.learner.trainer import Exported
from services.model.weights import write_weights
from services.runtime import RuntimeSettings, Service, logs
from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings

ROUNDS = 6
TRANSPORTS = ("disk", "distributed")
ACK_TIMEOUT_S = 300.0
ACKS: Codec[WeightSyncAck] = Codec(WeightSyncAck)
#: Server calls of the weight transaction, in order, as printed.
CALLS = (
    "/pause_generation",
    "/update_weights_from_disk",
    "/begin_weight_update",
    "/update_weights_from_distributed",
    "/end_weight_update",
    "/flush_cache",
    "/continue_generation",
)


class TimedEngine(SGLangEngine):
    """The SGLang engine, timing each control call of the weight transaction."""

    def __init__(self, urls: Sequence[str]) -> None:
        super().__init__(urls, SGLangEngineSettings(check_raw_logprobs=False))
        self.seconds: defaultdict[str, float] = defaultdict(float)

    async def _control(
        self, url: str, path: str, payload: Mapping[str, Any] | None, *, update: bool = False
    ) -> None:
        started = time.perf_counter()
        try:
            await super()._control(url, path, payload, update=update)
        finally:
            self.seconds[path] += time.perf_counter() - started


class DigestClock:
    """Times the generator's digest check (its module-level ``verify_digest``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._real = vars(generator_module)["verify_digest"]

    def __call__(self, path: Path, expected: str) -> None:
        started = time.perf_counter()
        try:
            self._real(path, expected)
        finally:
            self.seconds += time.perf_counter() - started


class SignallingWeightServer(WeightServer):
    """The learner's weight server, telling when a broadcast thread has ended."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent = asyncio.Event()

    async def _broadcast(self, group: Any, snapshot: Any) -> None:
        try:
            await super()._broadcast(group, snapshot)
        finally:
            self.sent.set()


class WeightHost(Service):
    """The learner's weight server in a service of its own (what the learner runs)."""

    name = "learner"

    def __init__(self, runtime: RuntimeSettings) -> None:
        super().__init__(runtime)
        settings = BroadcastSettings(timeout_s=120)
        self.weights = SignallingWeightServer(settings, self.instance, self.log)

    async def setup(self) -> None:
        self.weights.listen(self)

    async def teardown(self) -> None:
        await self.weights.close()


@dataclass
class Round:
    transport: str
    version: int
    total_s: float
    export_s: float
    snapshot_s: float = 0.0
    digest_s: float = 0.0
    broadcast_s: float = 0.0
    calls: dict[str, float] = field(default_factory=dict)

    @property
    def other_s(self) -> float:
        serial = self.export_s + self.snapshot_s + self.digest_s + sum(self.calls.values())
        return self.total_s - serial

    def parts(self) -> dict[str, float]:
        parts = {"export": self.export_s, "snapshot": self.snapshot_s, "digest": self.digest_s}
        parts.update({call.lstrip("/"): self.calls.get(call, 0.0) for call in CALLS})
        parts["broadcast (overlaps)"] = self.broadcast_s
        parts["other"] = self.other_s
        return parts


class Bench:
    def __init__(
        self,
        nc: Client,
        host: WeightHost,
        engine: TimedEngine,
        digest: DigestClock,
        model: Any,
        source: Path,
        out: Path,
    ) -> None:
        self.nc = nc
        self.host = host
        self.engine = engine
        self.digest = digest
        self.model = model
        self.source = source
        self.out = out
        self.config_json = (source / "config.json").read_text()
        self.acks: asyncio.Queue[WeightSyncAck] = asyncio.Queue()

    async def subscribe(self) -> None:
        async def on_ack(msg: Msg) -> None:
            self.acks.put_nowait(ACKS.decode(msg.data))

        await self.nc.subscribe(subjects.weight_ack("generator"), cb=on_ack)
        await self.nc.flush()

    def nudge(self, seed: int) -> None:
        """A new version: every weight moved a little (outside the clock)."""
        import torch

        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for parameter in self.model.parameters():
                noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
                parameter.add_(noise * 1e-3)

    async def round(self, transport: str, version: int) -> Round:
        self.nudge(version)
        self.engine.seconds.clear()
        self.digest.seconds = 0.0
        weights = self.host.weights
        weights.sent.clear()
        started = time.perf_counter()
        exported = await asyncio.to_thread(self._export, version)
        export_s = time.perf_counter() - started
        snapshot_s = await self._announce(transport, exported)
        await self._acked(version)
        total_s = time.perf_counter() - started
        if transport == "distributed":
            await self._broadcast_done()
        return Round(
            transport=transport,
            version=version,
            total_s=total_s,
            export_s=export_s,
            snapshot_s=snapshot_s,
            digest_s=self.digest.seconds,
            broadcast_s=weights.last_broadcast_s if transport == "distributed" else 0.0,
            calls=dict(self.engine.seconds),
        )

    def _export(self, version: int) -> Exported:
        target = self.out / f"v{version}"
        digest = write_weights(self.model, self.config_json, self.source, target)
        return Exported(version=version, path=target, digest=digest)

    async def _announce(self, transport: str, exported: Exported) -> float:
        """Publish the PolicyUpdate; returns the snapshot's seconds (distributed only)."""
        update = PolicyUpdate(
            version=exported.version, uri=str(exported.path), digest=exported.digest
        )
        snapshot_s = 0.0
        if transport == "distributed":
            started = time.perf_counter()
            update = await self.host.weights.offer(exported, update)
            snapshot_s = time.perf_counter() - started
        await self.nc.publish(subjects.policy_update(), encode(update))
        self.host.weights.announced(exported.version)
        return snapshot_s

    async def _broadcast_done(self) -> None:
        """The learner's thread may end after the server acked: wait for its figure."""
        async with asyncio.timeout(ACK_TIMEOUT_S):
            await self.host.weights.sent.wait()

    async def _acked(self, version: int) -> None:
        async with asyncio.timeout(ACK_TIMEOUT_S):
            while True:
                ack = await self.acks.get()
                if not ack.ok:
                    raise RuntimeError(f"version {ack.version} failed: {ack.error}")
                if ack.version >= version:
                    return

    async def restore(self, version: int) -> None:
        """Leave the server serving the model's own weights (by disk, untimed)."""
        update = PolicyUpdate(version=version, uri=str(self.source), digest=_digest(self.source))
        await self.nc.publish(subjects.policy_update(), encode(update))
        await self._acked(version)


def _digest(path: Path) -> str:
    from services.model.weights import directory_digest

    return directory_digest(path)


def runtime(url: str, instance: str) -> RuntimeSettings:
    return RuntimeSettings(nats_url=url, instance=instance, heartbeat_s=1.0, stats_s=60.0)


async def measure(nats_url: str, server_url: str, model_dir: Path, out: Path, rounds: int) -> str:
    import torch
    from transformers import AutoModelForCausalLM

    logs.configure("bench-weight-transport", level="error")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    engine = TimedEngine([server_url])
    digest = DigestClock()
    vars(generator_module)["verify_digest"] = digest
    settings = GeneratorSettings(
        runtime=runtime(nats_url, "bench-generator"),
        model=model_dir,
        engine="sglang",
        sglang_urls=(server_url,),
        tools="local",
        check_domains=False,
        weight_disk_fallback=False,
    )
    nc = await nats.connect(nats_url)
    try:
        async with WeightHost(runtime(nats_url, "bench-learner")) as host:
            async with GeneratorService(settings, engine=engine) as generator:
                assert isinstance(host, WeightHost) and isinstance(generator, GeneratorService)
                bench = Bench(nc, host, engine, digest, model, model_dir, out)
                await bench.subscribe()
                return await run_rounds(bench, generator.version, rounds)
    finally:
        vars(generator_module)["verify_digest"] = digest._real
        await nc.close()


async def run_rounds(bench: Bench, base: int, rounds: int) -> str:
    version = base
    warm: list[Round] = []
    for transport in TRANSPORTS:
        version += 1
        warm.append(await bench.round(transport, version))
    timed: list[Round] = []
    for _ in range(rounds):
        for transport in TRANSPORTS:
            version += 1
            timed.append(await bench.round(transport, version))
    await bench.restore(version + 1)
    return "\n".join(report(warm, timed, _size(bench.source)))


def _size(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def spread(values: Sequence[float]) -> str:
    return f"{ms(min(values))}-{ms(max(values))} ms (median {ms(statistics.median(values))})"


def round_line(index: int, done: Round) -> str:
    parts = ", ".join(f"{name} {ms(value)}" for name, value in done.parts().items() if value)
    return f"round {index} {done.transport:<11}: {ms(done.total_s)} ms ({parts})"


def breakdown(timed: Sequence[Round], transport: str) -> str:
    rounds = [r for r in timed if r.transport == transport]
    names = rounds[0].parts().keys()
    medians = {n: statistics.median(r.parts()[n] for r in rounds) for n in names}
    return f"{transport:<11} median ms: " + ", ".join(
        f"{name} {ms(value)}" for name, value in medians.items() if value
    )


def report(warm: Sequence[Round], timed: Sequence[Round], weight_bytes: int) -> list[str]:
    lines = [
        f"weights {weight_bytes / 1e6:.1f} MB; {len(timed) // 2} rounds of each, disk first; "
        f"{os.cpu_count()} CPU cores shared by the SGLang server, nats-server and this process",
        f"warm-up: disk {ms(warm[0].total_s)} ms; distributed {ms(warm[1].total_s)} ms "
        "(opens the process group)",
    ]
    lines += [round_line(i // 2 + 1, r) for i, r in enumerate(timed)]
    totals = {t: [r.total_s for r in timed if r.transport == t] for t in TRANSPORTS}
    for transport in TRANSPORTS:
        lines.append(f"{transport:<11} publication -> serving: {spread(totals[transport])}")
    ratios = [d / k for k, d in zip(totals["disk"], totals["distributed"], strict=True)]
    lines.append(
        "ratio distributed/disk per round: "
        + " ".join(f"{r:.2f}" for r in ratios)
        + f" (range {min(ratios):.2f}-{max(ratios):.2f}, median {statistics.median(ratios):.2f})"
    )
    lines += [breakdown(timed, t) for t in TRANSPORTS]
    return lines


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="timed rounds of each")
    parser.add_argument("--model", type=Path, help="HF model dir (default: a fresh tiny model)")
    parser.add_argument(
        "--server", help="URL of a running SGLang server serving --model (default: start one)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="temper-bench-weights-") as tmp_dir:
        tmp = Path(tmp_dir)
        model = args.model
        if model is None:
            from services.model.tiny import init_model

            model = init_model(tmp / "policy")
        nats_server = NatsServer(NatsServerSettings(store_dir=tmp / "nats", port=RANDOM_PORT))
        nats_server.start()
        try:
            text = with_server(args.server, model, tmp, nats_server.url, args.rounds)
        finally:
            nats_server.stop()
    print(text)
    return 0


def with_server(url: str | None, model: Path, tmp: Path, nats_url: str, rounds: int) -> str:
    (tmp / "weights").mkdir()
    if url is not None:
        return asyncio.run(measure(nats_url, url, model, tmp / "weights", rounds))
    python = sglang_python(os.environ)
    if python is None:
        return "bench_weight_transport: skipped: no CPU SGLang venv (deploy/sglang-cpu/build.sh)"
    server = SGLangServer(SGLangServerSettings(model_path=model, python=python, log_dir=tmp))

    async def run() -> str:
        await server.start()
        return await measure(nats_url, server.url, model, tmp / "weights", rounds)

    try:
        return asyncio.run(run())
    finally:
        server.terminate()


if __name__ == "__main__":
    sys.exit(main())
