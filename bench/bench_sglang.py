"""SGLang engine on the CPU SGLang server: tokens/s, and an 8-turn agent workload's cache use.

Starts a real SGLang 0.5.23 server (the venv of deploy/sglang-cpu/build.sh; without it
this prints why and exits 0) on `temper model init`'s tiny model, float32, loopback.

1. Throughput: generated tokens/s of one request at a time, and of 8 at once.
2. Agent workload (the shape of bench_generator.py's): 4 trajectories share a 300-token
   system prompt, each has its own 40-token task; every turn samples 16 tokens, then a
   deterministic local "tool" appends 100 observation tokens derived from them, and the
   next prompt is the whole conversation (token ids, never re-tokenized).  8 turns.
   - reusable prompt tokens of a request: its longest common prefix with any earlier
     request's prompt + output (at most all but its last token): what an ideal prefix
     cache could serve.  cached: what SGLang reports in ``meta_info.cached_tokens``.
   - cache on: the workload as is.  Baseline, cache off: the same workload with
     ``/flush_cache`` before every request, measured in the same run.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent_workload import (
    NEW_TOKENS,
    TOOL_TOKENS,
    TRAJECTORIES,
    TURNS,
    Workload,
    first_prompts,
    reusable,
    tokens,
    tool_output,
)

from services.engines.engine import GenerateRequest, Sampling
from services.engines.sglang.engine import SGLangEngine
from services.engines.sglang.server import SGLangServer, SGLangServerSettings, sglang_python

THROUGHPUT_TOKENS = 64
THROUGHPUT_BATCH = 8


@dataclass
class Lane:
    """One pass over the workload."""

    name: str
    wall_s: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    reusable_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    seen: list[list[int]] = field(default_factory=list)

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / self.reusable_tokens if self.reusable_tokens else 0.0


async def run_lane(engine: SGLangEngine, lane: Lane, turns: int, flush_each: bool) -> None:
    conversations = first_prompts(Workload())
    await engine.flush_cache()
    for turn in range(turns):
        for index, prompt in enumerate(conversations):
            if flush_each:
                await engine.flush_cache()
            sampling = Sampling(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=turn)
            request = GenerateRequest(
                prompt_ids=prompt, sampling=sampling, trajectory_id=f"{index}"
            )
            lane.reusable_tokens += reusable(prompt, lane.seen)
            started = time.perf_counter()
            [sample] = await engine.generate(request)
            lane.wall_s += time.perf_counter() - started
            lane.requests += 1
            lane.prompt_tokens += len(prompt)
            lane.cached_tokens += sample.cached_tokens
            lane.generated_tokens += len(sample.output_ids)
            lane.seen.append([*prompt, *sample.output_ids])
            conversations[index] = [
                *prompt,
                *sample.output_ids,
                *tool_output(index, turn, sample.output_ids, TOOL_TOKENS),
            ]


async def throughput(engine: SGLangEngine, concurrent: int) -> float:
    """Generated tokens per second with ``concurrent`` requests in flight (no early stop)."""
    sampling = Sampling(temperature=1.0, max_new_tokens=THROUGHPUT_TOKENS, stop_token_ids=())
    requests = [
        GenerateRequest(prompt_ids=tokens(50 + i, 32), sampling=sampling, trajectory_id=f"tp{i}")
        for i in range(concurrent)
    ]
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(r) for r in requests))
    wall = time.perf_counter() - started
    return sum(len(s.output_ids) for samples in results for s in samples) / wall


def report_lanes(on: Lane, off: Lane) -> None:
    print(f"agent workload: {TRAJECTORIES} trajectories x {on.requests // TRAJECTORIES} turns")
    columns = ("wall s", 8), ("prompt tok", 10), ("reusable", 9), ("cached", 8)
    print(f"{'':10} " + " ".join(f"{name:>{width}}" for name, width in columns), end="")
    print(f" {'cached/reusable':>16}")
    for lane in (on, off):
        print(
            f"{lane.name:10} {lane.wall_s:8.2f} {lane.prompt_tokens:10d} {lane.reusable_tokens:9d} "
            f"{lane.cached_tokens:8d} {lane.cached_fraction:16.1%}"
        )
    speedup = off.wall_s / on.wall_s if on.wall_s else 0.0
    print(f"cached-token ratio (cache on): {on.cached_fraction:.1%} of reusable prompt tokens")
    print(f"wall time, cache off / cache on: {speedup:.2f}x")


async def bench(python: Path, model: Path, turns: int) -> None:
    settings = SGLangServerSettings(model_path=model, python=python)
    started = time.perf_counter()
    async with SGLangServer(settings) as server:
        print(f"SGLang server ready in {time.perf_counter() - started:.1f}s at {server.url}")
        async with SGLangEngine([server.url]) as engine:
            await throughput(engine, 1)  # warm-up
            single = await throughput(engine, 1)
            batched = await throughput(engine, THROUGHPUT_BATCH)
            print(f"tokens/s, 1 request: {single:.1f}")
            print(f"tokens/s, {THROUGHPUT_BATCH} concurrent: {batched:.1f}")
            on, off = Lane("cache on"), Lane("cache off")
            await run_lane(engine, on, turns, flush_each=False)
            await run_lane(engine, off, turns, flush_each=True)
            report_lanes(on, off)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--model", type=Path, help="HF model dir (default: a fresh tiny model)")
    args = parser.parse_args(argv)
    python = sglang_python(os.environ)
    if python is None:
        print("bench_sglang: skipped: no CPU SGLang venv; build it with deploy/sglang-cpu/build.sh")
        return 0
    with tempfile.TemporaryDirectory(prefix="temper-bench-sglang-") as tmp:
        model = args.model
        if model is None:
            from services.model.tiny import init_model

            model = init_model(Path(tmp) / "policy")
        asyncio.run(bench(python, model, args.turns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
