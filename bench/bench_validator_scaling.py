"""Validator throughput with one process and with two: the scaling ratio 2/1.

Every round prefills TEMPER_ROLLOUTS on one real nats-server (loopback) with the same
Rollout messages as ``bench_validator.py`` (arithmetic domain, 80 tokens each, every third
answer wrong), then times the validator processes draining them: the clock runs from the
moment their consumer may deliver until TEMPER_SCORED holds every result.  The processes
are ``python -m services serve validator``, as ``temper up`` runs them, sharing the
durable consumer ``validator`` (their queue group).  They are started before the clock
and ready (each has sent its heartbeat); the consumer is paused while the stream fills and
resumed when the clock starts.  Rounds alternate 1, 2, 1, 2, ... after one untimed
warm-up of each.

Besides the rates and the 2/1 ratio of each round, the output says where the time went:
the CPU seconds of each validator, of nats-server and of this client during each timed
window (``/proc/<pid>/stat``), the whole machine's busy cores, and the validator's own
``validate`` stage from its stats (judging a fetch, publishing its results, waiting for
their stream acks).

This machine has 2 CPU cores, shared by nats-server, the validators and this bench
client: the ratio is bounded by that, not by the validator alone.  A second process can
add at most what the first leaves idle.  Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import nats
from bench_validator import DOMAIN, VALIDATOR_IN_FLIGHT, fill, payloads
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.messages import Heartbeat, Stats
from services.cli.common import run
from services.runtime.jetstream import ensure_stream, ensure_streams
from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from services.runtime.procs import child_preexec, terminate

ROOT = Path(__file__).resolve().parents[1]
N_ROLLOUTS = 40_000
ROUNDS = 4
DURABLE = "validator"
ROLLOUTS = streams.ROLLOUTS.name
SCORED = streams.SCORED.name
#: Far enough ahead that the consumer stays paused until it is resumed.
PAUSED_UNTIL = "2099-01-01T00:00:00Z"
READY_TIMEOUT_S = 60.0
STATS_S = 0.25
POLL_S = 0.01
STOP_GRACE_S = 10.0
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far, from ``/proc/<pid>/stat``."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, field 3 on
    return (int(fields[11]) + int(fields[12])) * TICK_S


def machine_busy_seconds() -> float:
    """Busy CPU seconds of all cores together so far, from ``/proc/stat``."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) * TICK_S  # guest time is in user time already


@dataclass
class Window:
    """One timed drain: its rate and what every process spent in it."""

    processes: int
    seconds: float
    rollouts: int
    validators: list[float]
    server: float
    client: float
    machine_busy: float
    #: Per validator: its stats values once the drain was done.
    stats: list[dict[str, float]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.rollouts / self.seconds

    def cores(self, cpu_s: float) -> float:
        return cpu_s / self.seconds


class Control:
    """Heartbeats and stats of the validator processes, the latest per instance."""

    def __init__(self) -> None:
        self.beats: dict[str, Heartbeat] = {}
        self.stats: dict[str, Stats] = {}
        self._heartbeats: Codec[Heartbeat] = Codec(Heartbeat)
        self._stats: Codec[Stats] = Codec(Stats)

    async def subscribe(self, nc: Client) -> None:
        await nc.subscribe(subjects.heartbeat("validator"), cb=self._on_heartbeat)
        await nc.subscribe(subjects.stats("validator"), cb=self._on_stats)

    async def _on_heartbeat(self, msg: Msg) -> None:
        beat = self._heartbeats.decode(msg.data)
        self.beats[beat.instance] = beat

    async def _on_stats(self, msg: Msg) -> None:
        stats = self._stats.decode(msg.data)
        self.stats[stats.instance] = stats

    async def ready(self, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        """Until every instance has sent a heartbeat (its consumer exists by then)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        # Heartbeats arrive on a subscription's callback: nothing to await but the dict.
        while not all(name in self.beats for name in procs):
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"validator {name} exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"validators not ready after {READY_TIMEOUT_S:.0f}s")
            await asyncio.sleep(POLL_S)

    async def settled(self, names: Sequence[str], after: float, published: int) -> list[Stats]:
        """Each instance's first stats sent after ``after`` once they count ``published``."""
        deadline = time.monotonic() + 10 * STATS_S + 5.0
        while time.monotonic() < deadline:
            got = [self.stats.get(name) for name in names]
            fresh = [s for s in got if s is not None and s.sent_at > after]
            if len(fresh) == len(names):
                if sum(s.values.get("published", 0.0) for s in fresh) >= published:
                    return fresh
                after = max(s.sent_at for s in fresh)  # an ack still on its way: the next
            await asyncio.sleep(STATS_S / 4)
        return [s for name in names if (s := self.stats.get(name)) is not None]


def spawn(url: str, instance: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """One validator process, as ``temper up`` runs it, with the settings of bench_validator."""
    env = {
        **os.environ,
        "TEMPER_NATS_URL": url,
        "TEMPER_INSTANCE": instance,
        "TEMPER_HEARTBEAT_S": "0.5",
        "TEMPER_STATS_S": str(STATS_S),
        "TEMPER_LOG_LEVEL": "warning",
        "TEMPER_VALIDATOR_DURABLE": DURABLE,
        "TEMPER_VALIDATOR_DOMAIN_PLUGINS": "0",
        "TEMPER_VALIDATOR_MAX_IN_FLIGHT": str(VALIDATOR_IN_FLIGHT),
        "TEMPER_VALIDATOR_FETCH_WAIT_S": "0.2",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "services", "serve", "validator"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        preexec_fn=child_preexec(),
    )


@dataclass(frozen=True)
class Bench:
    js: JetStreamContext
    control: Control
    url: str
    server_pid: int
    logs: Path

    async def drain(self, count: int, messages: list[tuple[str, bytes]], tag: str) -> Window:
        """Start ``count`` validators, fill the stream, time them draining it; stop them."""
        names = [f"{tag}-{k}" for k in range(count)]
        with ExitStack() as stack:
            procs = {}
            for name in names:
                log = stack.enter_context((self.logs / f"{name}.log").open("wb"))
                procs[name] = spawn(self.url, name, log)
                stack.callback(terminate, procs[name], STOP_GRACE_S)
            window = await self._timed(procs, messages)
        await self._reset()
        return window

    async def _timed(
        self, procs: dict[str, subprocess.Popen[bytes]], messages: list[tuple[str, bytes]]
    ) -> Window:
        await self.control.ready(procs)
        await self.js.pause_consumer(ROLLOUTS, DURABLE, PAUSED_UNTIL)
        await fill(self.js, messages)
        if (await self.js.consumer_info(ROLLOUTS, DURABLE)).delivered.consumer_seq:
            raise RuntimeError("the consumer delivered rollouts while paused")
        pids = [proc.pid for proc in procs.values()]
        own, server = os.getpid(), self.server_pid
        before = [cpu_seconds(pid) for pid in (*pids, server, own)], machine_busy_seconds()
        started = time.perf_counter()
        await self.js.resume_consumer(ROLLOUTS, DURABLE)
        await self._scored(len(messages))
        seconds = time.perf_counter() - started
        after = [cpu_seconds(pid) for pid in (*pids, server, own)], machine_busy_seconds()
        spent = [b - a for a, b in zip(before[0], after[0], strict=True)]
        stats = await self.control.settled(list(procs), time.time(), len(messages))
        return Window(
            processes=len(procs),
            seconds=seconds,
            rollouts=len(messages),
            validators=spent[: len(pids)],
            server=spent[-2],
            client=spent[-1],
            machine_busy=after[1] - before[1],
            stats=[s.values for s in stats],
        )

    async def _scored(self, count: int) -> None:
        """Until TEMPER_SCORED holds ``count`` results."""
        deadline = time.monotonic() + 60.0 + count / 1000
        while (await self.js.stream_info(SCORED)).state.messages < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} rollouts not all scored in time")
            await asyncio.sleep(POLL_S)

    async def _reset(self) -> None:
        """No consumer, no rollouts, no results: the next round starts alike."""
        await self.js.delete_consumer(ROLLOUTS, DURABLE)
        await self.js.purge_stream(ROLLOUTS)
        # Made anew: a purge keeps the stream's Nats-Msg-Id window, and the next round's
        # results (the same rollout ids) would be taken for duplicates and not stored.
        await self.js.delete_stream(SCORED)
        await ensure_stream(self.js, streams.SCORED)


async def measure(
    url: str, server_pid: int, logs: Path, rollouts: int, rounds: int
) -> list[Window]:
    """Windows in the order run: 1, 2, 1, 2, ... (the warm-up is not among them)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await ensure_streams(js, (streams.ROLLOUTS, streams.SCORED))
    control = Control()
    await control.subscribe(nc)
    bench = Bench(js, control, url, server_pid, logs)
    messages = payloads(rollouts)
    warm_up = messages[: max(1, rollouts // 4)]
    await bench.drain(1, warm_up, "warm-1")
    await bench.drain(2, warm_up, "warm-2")
    windows = []
    for index in range(rounds):
        for count in (1, 2):
            windows.append(await bench.drain(count, messages, f"r{index}-{count}"))
    await nc.close()
    return windows


def spread(values: Sequence[float], form: str) -> str:
    low, high, mid = min(values), max(values), statistics.median(values)
    return f"{low:{form}}-{high:{form}} (median {mid:{form}})"


def stage_line(window: Window) -> str:
    """The validator's ``validate`` stage in this window, summed over its processes."""
    seconds = sum(s.get("time_validate_s", 0.0) for s in window.stats)
    batches = sum(s.get("count_validate", 0.0) for s in window.stats)
    if not batches:
        return "validate stage: no stats"
    split = "/".join(f"{s.get('published', 0.0):,.0f}" for s in window.stats)
    return (
        f"validate stage {seconds:.2f} s over {batches:,.0f} fetches "
        f"({seconds / batches * 1000:.1f} ms, {window.rollouts / batches:.0f} rollouts each; "
        f"{seconds / window.seconds:.2f} in it at once); "
        f"published per process {split}"
    )


def window_lines(window: Window, label: str) -> list[str]:
    each = " + ".join(f"{window.cores(v):.2f}" for v in window.validators)
    cpu_us = sum(window.validators) / window.rollouts * 1e6
    busy = window.machine_busy / window.seconds
    others = busy - window.cores(sum(window.validators) + window.server + window.client)
    return [
        f"  {label}: {window.processes} proc  {window.rate:>8,.0f} rollouts/s  "
        f"{window.seconds:.2f} s",
        f"      cores busy: validator {each}, nats-server {window.cores(window.server):.2f}, "
        f"client {window.cores(window.client):.2f}, other {max(0.0, others):.2f}; "
        f"machine {busy:.2f} of {os.cpu_count()}; validator CPU {cpu_us:.0f} us/rollout",
        f"      {stage_line(window)}",
    ]


def report(windows: list[Window], rollouts: int, rounds: int) -> list[str]:
    ones = [w for w in windows if w.processes == 1]
    twos = [w for w in windows if w.processes == 2]
    ratios = [b.rate / a.rate for a, b in zip(ones, twos, strict=True)]
    lines = [
        f"validator scaling, 1 vs 2 processes ({rollouts:,} {DOMAIN} rollouts a round, "
        f"{rounds} rounds of each, interleaved 1,2,1,2 after an untimed warm-up)",
        f"  this machine has {os.cpu_count()} CPU cores, shared by nats-server, the validators "
        "and this bench client: the 2/1 ratio is bounded by that",
        f"  each validator: python -m services serve validator, max_in_flight "
        f"{VALIDATOR_IN_FLIGHT}, durable consumer {DURABLE!r} shared (one queue group)",
    ]
    for index, (one, two) in enumerate(zip(ones, twos, strict=True)):
        lines += window_lines(one, f"round {index + 1}")
        lines += window_lines(two, f"round {index + 1}")
    lines += [
        f"  1 process    rollouts/s {spread([w.rate for w in ones], ',.0f')}",
        f"  2 processes  rollouts/s {spread([w.rate for w in twos], ',.0f')}",
        f"  scaling 2/1 per round   {'  '.join(f'{r:.2f}' for r in ratios)}  "
        f"range {spread(ratios, '.2f')}",
        f"  machine busy (of {os.cpu_count()} cores) 1 process "
        f"{spread([w.machine_busy / w.seconds for w in ones], '.2f')}, 2 processes "
        f"{spread([w.machine_busy / w.seconds for w in twos], '.2f')}",
        f"  cores busy, median of rounds: 1 process {where(ones)}; 2 processes {where(twos)}",
    ]
    return lines


def where(windows: list[Window]) -> str:
    """Median cores busy per process kind over ``windows``."""
    validators = statistics.median(w.cores(sum(w.validators)) for w in windows)
    server = statistics.median(w.cores(w.server) for w in windows)
    client = statistics.median(w.cores(w.client) for w in windows)
    return f"validators {validators:.2f}, nats-server {server:.2f}, client {client:.2f}"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rollouts", type=int, default=N_ROLLOUTS, help="rollouts a round")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="timed rounds of each")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(NatsServerSettings(store_dir=Path(tmp), port=RANDOM_PORT))
        server.start()
        pid = server.pid or 0
        try:
            windows = run(lambda: measure(server.url, pid, Path(tmp), args.rollouts, args.rounds))
        finally:
            server.stop()
    print("\n".join(report(windows, args.rollouts, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
