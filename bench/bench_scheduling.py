"""High-tier latency while low-tier multi-turn work holds every generator slot:
preemption at a turn boundary on vs off, in one run.

Each lane is a fresh nats-server and an in-process generator service (torch engine,
``max_concurrent_tasks`` 2, in-process ``local`` tools) serving the tiny policy after a
short supervised warm-up on the built-in ``tool_use`` domain's modpow puzzles, whose
prompts hold up to ``max_turns - 1`` (at least seven) earlier turns of the same tool
call and its output, with the call as the reference: it then answers most turns with a
``<tool_call>`` block, so a low-tier (tier 3) task runs many of its ``max_turns`` turns
(the local tools echo a call's arguments back, and the policy calls again).  24 turns by
default, an agentic trajectory that holds its slot for many turns, the case preemption
is for; the wait without it grows with the trajectory, the wait with it is about one
turn.  The warmed policy is cached under ``$TEMPER_CACHE`` (default /var/cache/temper)
by a hash of its recipe.

A lane keeps two low-tier tasks waiting besides those in both slots (so that a
preempted task, re-queued behind them, resumes within the lane), and submits high-tier
(tier 0) single-turn tasks at random intervals, each stamped ``created_at`` at submit:

- queue: ``Rollout.timings.queued_s``, generation start minus ``created_at`` (waiting
  for a slot: with preemption off, until a low-tier task ends; on, until a running
  trajectory reaches its next turn boundary and yields).
- published: submit to the rollout arriving on its subject (queue + generation +
  publishing).

Each repeat runs both lanes, alternating which goes first; ranges are over repeats.
Each lane's line shows the machine's load average at its end: where other work shares
the cores every turn is longer, and both waits with it.
Preemption overhead per trajectory is the generator's save plus restore stage time
per preempted trajectory, set against a plain turn (engine time per generated turn of
the same lane's low-tier trajectories).  With local tools there is no sandbox session to
snapshot: it is the bookkeeping alone.  A real sandbox session's snapshot and restore
are measured after the lanes (``--sandbox-rounds``; scheduling_sandbox.py).

Goal (issue 14): >= 5x lower high-tier p95 queue with preemption on.  Figures are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from scheduling_report import HIGH_TIER, LOW_TIER, Lane, Workload, render
from scheduling_sandbox import measure as measure_snapshots
from scheduling_sandbox import render as render_snapshots

from protocol import streams, subjects
from protocol.codec import Codec, encode
from protocol.messages import ChatMessage, Rollout, SamplingParams, Task
from services.cli.common import run
from services.domains import tool_use
from services.domains.api import Domain, Example, Split
from services.generator.service import GeneratorService
from services.generator.settings import GeneratorSettings
from services.model.cache import BUILDERS, cached_model, recipe_key
from services.model.sft import WarmupConfig
from services.model.tiny import TinyModelSpec
from services.model.tool_format import parse_tool_call
from services.runtime import logs
from services.runtime.jetstream import ensure_streams
from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from services.runtime.settings import RuntimeSettings

HIGH_DOMAIN, LOW_DOMAIN = "urgent", "tool_use"
#: The warm-up of the cached policy; a change of it (or of the recipe) makes a new one.
WARMUP = WarmupConfig(steps=80, lr=3e-3, examples=512)
RECIPE = "tool_use modpow, calls again after each output, v1"
#: The depth of the first recipe: its policy keeps its cache key (no depth in the hash).
FIRST_DEPTH = 7
ROLLOUTS: Codec[Rollout] = Codec(Rollout)
#: After the high-tier stream, how long preempted trajectories get to resume and finish.
RESUME_WAIT_S = 30.0


# ---------------------------------------------------------------- policy


@dataclass(frozen=True, kw_only=True)
class ToolLoop(Domain):
    """The tool_use domain's modpow puzzles (short calls), each prompt with up to
    ``depth`` earlier turns of the same call and its local-tool output, the call as the
    reference: a policy warmed on it calls the tool again at every turn, so a trajectory
    runs all its turns instead of answering (or, never having seen a long conversation,
    babbling to its token limit)."""

    depth: int = FIRST_DEPTH

    def examples(self, n: int, split: Split = "train", seed: int = 0) -> list[Example]:
        rng = random.Random(seed)
        return [
            self._looped(e, rng.randrange(self.depth + 1)) for e in super().examples(n, split, seed)
        ]

    def _looped(self, example: Example, turns: int) -> Example:
        call = example.reference.split("\n", 1)[0]
        parsed = parse_tool_call(call)
        assert not isinstance(parsed, str), parsed
        # What LocalTools answers a python call: its arguments, echoed.
        output = json.dumps(parsed.arguments, sort_keys=True)
        turn = [
            ChatMessage(role="assistant", content=call),
            ChatMessage(role="tool", content=output),
        ]
        prompt = [*example.task.prompt, *(turn * turns)]
        return Example(task=msgspec.structs.replace(example.task, prompt=prompt), reference=call)


def modpow() -> Domain:
    """tool_use with only its modpow puzzles: the shortest tool calls."""
    return tool_use.domain(LOW_DOMAIN, {"task": "modpow"})


def tool_domain(depth: int = FIRST_DEPTH) -> ToolLoop:
    base = modpow()
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return ToolLoop(**fields, depth=depth)


def depth_for(max_turns: int) -> int:
    """Earlier turns a warm-up prompt holds: enough that the policy calls again up to
    ``max_turns``, since past the longest conversation it saw it soon stops calling."""
    return max(FIRST_DEPTH, max_turns - 1)


def warmed_policy(depth: int = FIRST_DEPTH) -> Path:
    """The tool-calling tiny policy, built once per recipe (in the model cache): about a
    minute on 2 cores at the first depth, several at depth 23 (longer conversations)."""
    parts: list[object] = [RECIPE, repr(TinyModelSpec()), repr(WARMUP)]
    if depth != FIRST_DEPTH:
        parts.append(depth)
    sources = list(BUILDERS)

    def build(path: Path) -> None:
        from services.model.sft import supervised_warmup
        from services.model.tiny import init_model

        print(f"warming the tool-calling policy (depth {depth}, once) ...", flush=True)
        init_model(path, force=True)
        supervised_warmup(path, tool_domain(depth), WARMUP)

    return cached_model("bench-scheduling-policy", recipe_key(parts, sources), build)


# ---------------------------------------------------------------- tasks


def low_tasks(work: Workload) -> list[Task]:
    examples = modpow().examples(work.low_tasks, split="train", seed=work.seed)
    sampling = SamplingParams(max_tokens=work.turn_tokens, temperature=0.0)
    return [
        msgspec.structs.replace(
            e.task, id=f"low-{i}", tier=LOW_TIER, n=1, max_turns=work.max_turns, sampling=sampling
        )
        for i, e in enumerate(examples)
    ]


def high_task(index: int, work: Workload, prompt: Task) -> Task:
    """Single-turn, no tools; ``created_at`` is set when it is submitted."""
    return msgspec.structs.replace(
        prompt,
        id=f"high-{index}",
        domain=HIGH_DOMAIN,
        tier=HIGH_TIER,
        tools=[],
        n=1,
        max_turns=1,
        sampling=SamplingParams(max_tokens=work.high_tokens, temperature=0.0),
        metadata={},
    )


async def submit(nc: NATS, task: Task) -> None:
    await nc.jetstream().publish(
        subjects.of_task(task),
        encode(task),
        headers={"Nats-Msg-Id": task.id},
    )


class Tap:
    """Every rollout published in a lane, with the monotonic time it arrived."""

    def __init__(self) -> None:
        self.arrived: dict[str, tuple[Rollout, float]] = {}
        self.changed = asyncio.Event()

    async def on_msg(self, msg: Msg) -> None:
        rollout = ROLLOUTS.decode(msg.data)
        self.arrived[rollout.task.id] = (rollout, time.monotonic())
        self.changed.set()

    async def wait_for(self, task_ids: Sequence[str], timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    self.changed.clear()
                    if all(task_id in self.arrived for task_id in task_ids):
                        return
                    await self.changed.wait()
        except TimeoutError:
            missing = [t for t in task_ids if t not in self.arrived]
            raise RuntimeError(f"no rollout within {timeout_s:g}s for {missing}") from None


# ---------------------------------------------------------------- lanes


def preemption_available() -> bool:
    return "preemption" in {f.name for f in dataclasses.fields(GeneratorSettings)}


def lane_settings(url: str, policy: Path, work: Workload, preemption: bool) -> GeneratorSettings:
    switch = {"preemption": preemption} if preemption_available() else {}
    return GeneratorSettings(
        # A short grace: in-flight low-tier work is handed back at the end of a lane.
        runtime=RuntimeSettings(
            nats_url=url, instance=f"bench-{preemption}", grace_s=0.5, stats_s=60
        ),
        model=policy,
        tools="local",
        check_domains=False,
        max_concurrent_tasks=work.slots,
        fetch_wait_s=0.2,
        prefix_cache_mb=64,
        **switch,  # type: ignore[arg-type]
    )


async def run_lane(policy: Path, work: Workload, preemption: bool) -> Lane:
    with tempfile.TemporaryDirectory(prefix="temper-bench-sched-") as tmp:
        server = NatsServer(NatsServerSettings(store_dir=Path(tmp), port=RANDOM_PORT))
        server.start()
        try:
            return await _lane_on(server.url, policy, work, preemption)
        finally:
            server.stop()


async def _lane_on(url: str, policy: Path, work: Workload, preemption: bool) -> Lane:
    nc = await nats.connect(url)
    try:
        await ensure_streams(nc.jetstream(), streams.ALL)
        tap = Tap()
        await nc.subscribe(subjects.rollouts(), cb=tap.on_msg)
        settings = lane_settings(url, policy, work, preemption)
        async with GeneratorService(settings) as service:
            lane = await _drive(nc, tap, service, work, preemption)
            lane.stats = service.statistics()
        return lane
    finally:
        await nc.close()


async def _drive(
    nc: NATS, tap: Tap, service: GeneratorService, work: Workload, preemption: bool
) -> Lane:
    low = low_tasks(work)
    # Unmeasured: the engine's first request, and the high tier's consumer made.
    await _submit_high(nc, high_task(-1, work, low[0]))
    await tap.wait_for(["high--1"], timeout_s=120)
    busy: list[int] = []
    feeder = asyncio.create_task(_feed(nc, iter(low), work, service, busy))
    try:
        await _saturated(service, work.slots)
        busy.clear()
        started = time.monotonic()
        submitted = await _high_stream(nc, work, low[0])
        await tap.wait_for(list(submitted), timeout_s=120 + 30 * work.high_tasks)
        wall_s, in_flight = time.monotonic() - started, statistics.mean(busy)
        await _resumed(service, RESUME_WAIT_S)
    finally:
        feeder.cancel()
    lane = Lane(
        preemption=preemption,
        wall_s=wall_s,
        busy=in_flight / work.slots,
        load=os.getloadavg()[0],
    )
    for task_id, at in submitted.items():
        rollout, arrived = tap.arrived[task_id]
        lane.queued.append(rollout.timings.queued_s)
        lane.published.append(arrived - at)
        lane.generating.append(rollout.timings.total_s)
    _count_low(lane, [r for r, _ in tap.arrived.values() if r.task.tier == LOW_TIER])
    return lane


async def _feed(
    nc: NATS, tasks: Iterator[Task], work: Workload, service: GeneratorService, busy: list[int]
) -> None:
    """Keep ``backlog`` low-tier tasks waiting besides those in the slots: enough that a
    freed slot always finds one, few enough that a preempted task, re-queued behind them,
    is resumed within the lane (so its restore is measured).  Samples the slots in use
    into ``busy`` as it goes."""
    js = nc.jetstream()
    stream = streams.TASK_STREAMS[LOW_TIER].name
    while True:
        held = (await js.stream_info(stream)).state.messages  # waiting and in flight
        for _ in range(work.slots + work.backlog - held):
            task = next(tasks, None)
            if task is None:
                raise RuntimeError(f"the lane used all {work.low_tasks} low-tier tasks")
            await submit(nc, task)
        busy.append(service.in_flight)
        await asyncio.sleep(0.1)


async def _resumed(service: GeneratorService, timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) until every preempted trajectory has been resumed and
    finished; the report shows any that were not."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while True:
                stats = service.statistics()
                if stats.get("resumes", 0.0) >= stats.get("preemptions", 0.0):
                    return
                await asyncio.sleep(0.1)


async def _submit_high(nc: NATS, task: Task) -> float:
    at = time.monotonic()
    await submit(nc, msgspec.structs.replace(task, created_at=time.time()))
    return at


async def _saturated(service: GeneratorService, slots: int) -> None:
    """Wait until low-tier tasks hold every slot, and their trajectories are under way."""
    async with asyncio.timeout(60):
        while service.in_flight < slots:  # noqa: ASYNC110 (the service signals no event)
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)


async def _high_stream(nc: NATS, work: Workload, prompt: Task) -> dict[str, float]:
    """Submit the high-tier tasks at random gaps; their submit times by task id."""
    rng = random.Random(work.seed)
    submitted: dict[str, float] = {}
    for index in range(work.high_tasks):
        task = high_task(index, work, prompt)
        submitted[task.id] = await _submit_high(nc, task)
        await asyncio.sleep(work.interval_s * rng.uniform(0.5, 1.5))
    return submitted


def _count_low(lane: Lane, rollouts: Sequence[Rollout]) -> None:
    for rollout in rollouts:
        lane.low_trajectories += 1
        lane.low_turns += sum(segment.kind == "gen" for segment in rollout.segments)
        lane.low_generate_s += rollout.timings.generate_s
        lane.low_tool_s += rollout.timings.tool_s


async def run_bench(policy: Path, work: Workload, repeats: int, with_on: bool) -> list[list[Lane]]:
    """Per repeat, its lanes in the order they ran (off first on even repeats)."""
    rounds: list[list[Lane]] = []
    for repeat in range(repeats):
        order = [False, True] if repeat % 2 == 0 else [True, False]
        lanes = []
        for preemption in order if with_on else [False]:
            lanes.append(await run_lane(policy, work, preemption))
            print(f"  repeat {repeat + 1}: preemption {lanes[-1].name} done", flush=True)
        rounds.append(lanes)
    return rounds


# ---------------------------------------------------------------- report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one repeat, few tasks of 4 turns of 64 tokens at most (smoke test)",
    )
    parser.add_argument("--high-tasks", type=int, default=Workload.high_tasks)
    parser.add_argument("--interval", type=float, default=Workload.interval_s)
    parser.add_argument("--max-turns", type=int, default=Workload.max_turns)
    parser.add_argument("--turn-tokens", type=int, default=Workload.turn_tokens)
    parser.add_argument(
        "--sandbox-rounds",
        type=int,
        default=5,
        help="rounds of a real sandbox session's snapshot and restore (0: none)",
    )
    args = parser.parse_args(argv)
    # Quiet: service logs would cut the table.
    logs.configure("bench-scheduling", level="error")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    work = Workload(
        high_tasks=args.high_tasks,
        interval_s=args.interval,
        max_turns=args.max_turns,
        turn_tokens=args.turn_tokens,
    )
    repeats = args.repeats
    if args.quick:
        # Shorter low-tier turns: the high tier waits off a slot for a whole trajectory.
        quick_turns, quick_tokens = min(work.max_turns, 4), min(work.turn_tokens, 64)
        work = dataclasses.replace(
            work, high_tasks=3, max_turns=quick_turns, turn_tokens=quick_tokens
        )
        repeats, args.sandbox_rounds = 1, min(args.sandbox_rounds, 1)
    with_on = preemption_available()
    note = "" if with_on else "preemption on: not in this build (no GeneratorSettings.preemption)"
    policy = warmed_policy(depth_for(work.max_turns))
    rounds = run(lambda: run_bench(policy, work, repeats, with_on))
    print("\n".join(render(rounds, work, note)))
    if args.sandbox_rounds > 0:
        snapshots = run(lambda: measure_snapshots(args.sandbox_rounds))
        print("\n".join(render_snapshots(snapshots)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
