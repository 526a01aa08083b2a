"""What the gateway adds to a call, side by side in one run: the same tiny completion
asked through the gateway (the official ``openai`` client, HTTP, the chat template, the
session record) and asked directly on the bus (the task with its ``GatewayCall`` a
generator answers, the gateway's own path without the gateway).

One stack (``temper up``: nats-server, a generator on the tiny policy, the gateway),
``--sessions`` callers at once, each making calls one after the other, every call its
own session (recorded, never rewarded).  Per call: wall time at the caller, p50 and p99,
for both paths; the engine's own time (the rollout's ``generate_s``) beside them; and
calls/s.  Rounds alternate the two paths; each figure is printed per round and as the
range over rounds.

Goals (issue 30): p50 added <= 2 ms, p99 added <= 10 ms, throughput through the gateway
>= 0.8x direct.  Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import nats

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.messages import CallResult, GatewayCall, SamplingParams, Task
from protocol.packed import pack_i32
from services.model.chat_template import TemplateTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_stack import KEY, TEMPER, GatewayStack

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
RESULTS: Codec[CallResult] = Codec(CallResult)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def service_pids(parent: int) -> dict[str, int]:
    """The services ``temper up`` started, by name (``temper serve NAME``)."""
    found = {"bench client": os.getpid()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == parent and b"serve" in words:
            found[words[words.index(b"serve") + 1].decode()] = int(entry.name)
    return found


@dataclass
class Round:
    path: str
    latencies: list[float] = field(default_factory=list)
    engine: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: CPU seconds each process spent in the round.
    cpu: dict[str, float] = field(default_factory=dict)
    #: Calls each caller made.
    calls: int = 1

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed_s


def stack_for(args: argparse.Namespace) -> GatewayStack:
    """A generator and the gateway on a new tiny policy."""
    env = {"TEMPER_GENERATOR_MAX_CONCURRENT_TASKS": str(args.sessions)}

    def init(path: Path) -> None:
        subprocess.run([str(TEMPER), "model", "init", str(path)], check=True)

    return GatewayStack("bench-gateway-", ("generator", "gateway", "control"), env, init)


async def through_gateway(stack: GatewayStack, args: argparse.Namespace) -> Round:
    from openai import AsyncOpenAI

    found = Round("gateway")
    async with AsyncOpenAI(base_url=stack.url, api_key=KEY, max_retries=0, timeout=60) as client:

        async def caller(index: int) -> None:
            for call in range(args.calls):
                started = time.perf_counter()
                await client.chat.completions.create(
                    model="temper-policy",
                    messages=MESSAGES,  # type: ignore[arg-type]
                    max_tokens=args.max_tokens,
                    seed=call,
                    extra_headers={"X-Temper-Session": f"s{index}-{call}-{uuid.uuid4().hex[:6]}"},
                )
                found.latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(caller(i) for i in range(args.sessions)))
        found.elapsed_s = time.perf_counter() - started
    return found


async def direct(stack: GatewayStack, args: argparse.Namespace) -> Round:
    found = Round("direct")
    tokenizer = TemplateTokenizer.load(stack.model)
    prompt = tokenizer.encode(tokenizer.render_text(MESSAGES))
    nc = await nats.connect(f"nats://127.0.0.1:{stack.nats_port}")
    js = nc.jetstream()
    waiting: dict[str, asyncio.Future[CallResult]] = {}

    async def answered(msg: nats.aio.msg.Msg) -> None:
        result = RESULTS.decode(msg.data)
        waiting.pop(result.task_id).set_result(result)

    await nc.subscribe(subjects.gateway_replies("bench-direct"), cb=answered)

    async def caller(index: int) -> None:
        for call in range(args.calls):
            task_id = f"direct-{uuid.uuid4().hex}"
            task = Task(
                id=task_id,
                domain="gateway",
                tenant="bench",
                prompt_tokens=pack_i32(prompt),
                sampling=SamplingParams(max_tokens=args.max_tokens, seed=call),
                call=GatewayCall(
                    reply=subjects.gateway_reply("bench-direct", task_id), new_samples=1
                ),
            )
            started = time.perf_counter()
            answer = waiting[task_id] = asyncio.get_running_loop().create_future()
            await js.publish(subjects.of_task(task), encode(task), headers={"Nats-Msg-Id": task_id})
            result = await answer
            found.latencies.append(time.perf_counter() - started)
            found.engine.append(result.rollouts[0].timings.generate_s)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(caller(i) for i in range(args.sessions)))
        found.elapsed_s = time.perf_counter() - started
    finally:
        await nc.close()
    return found


def report(rounds: list[Round], alone: list[Round]) -> None:
    direct_alone, gateway_alone = alone
    print(
        f"one caller, {len(direct_alone.latencies)} calls each: p50 direct "
        f"{direct_alone.p(0.5):.1f} ms, gateway {gateway_alone.p(0.5):.1f} ms (added "
        f"{gateway_alone.p(0.5) - direct_alone.p(0.5):.1f} ms); p99 added "
        f"{gateway_alone.p(0.99) - direct_alone.p(0.99):.1f} ms"
    )
    print(f"{len(rounds[0].latencies) // max(1, rounds[0].calls)} callers at once:")
    for item in rounds:
        engine = (
            f", engine p50 {statistics.median(item.engine) * 1000:.1f} ms" if item.engine else ""
        )
        print(
            f"{item.path:8} {len(item.latencies)} calls, p50 {item.p(0.5):.1f} ms, "
            f"p99 {item.p(0.99):.1f} ms, {item.rate:.1f} calls/s{engine}"
        )
        shares = ", ".join(
            f"{name} {seconds * 1000 / len(item.latencies):.1f}"
            for name, seconds in sorted(item.cpu.items())
        )
        print(f"         CPU ms per call: {shares}")
    pairs = list(zip(rounds[0::2], rounds[1::2], strict=True))
    added50 = [g.p(0.5) - d.p(0.5) for d, g in pairs]
    added99 = [g.p(0.99) - d.p(0.99) for d, g in pairs]
    ratio = [g.rate / d.rate for d, g in pairs]
    print(
        f"added by the gateway, over {len(pairs)} rounds: p50 {min(added50):.1f} to "
        f"{max(added50):.1f} ms (goal <= 2), p99 {min(added99):.1f} to {max(added99):.1f} ms "
        f"(goal <= 10); throughput gateway/direct {min(ratio):.2f} to {max(ratio):.2f}x "
        f"(goal >= 0.8)"
    )


async def measure(stack: GatewayStack, args: argparse.Namespace) -> tuple[list[Round], list[Round]]:
    """The loaded rounds, alternating the paths, and one caller alone on each path (what
    a call costs when nothing queues)."""
    warm = argparse.Namespace(**{**vars(args), "calls": 2})
    await direct(stack, warm)
    await through_gateway(stack, warm)
    alone = argparse.Namespace(**{**vars(args), "sessions": 1, "calls": args.alone_calls})
    unloaded = [await direct(stack, alone), await through_gateway(stack, alone)]
    pids = service_pids(stack.proc.pid)
    rounds: list[Round] = []
    for _ in range(args.rounds):
        for path in (direct, through_gateway):
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            found = await path(stack, args)
            found.cpu = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
            found.calls = args.calls
            rounds.append(found)
    return rounds, unloaded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=64, help="callers at once")
    parser.add_argument("--calls", type=int, default=8, help="calls per caller and round")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--alone-calls", type=int, default=100, help="calls of one caller alone")
    args = parser.parse_args(argv)
    stack = stack_for(args)
    try:
        stack.wait_ready()
        rounds, alone = asyncio.run(measure(stack, args))
    finally:
        stack.stop()
    report(rounds, alone)
    return 0


if __name__ == "__main__":
    sys.exit(main())
