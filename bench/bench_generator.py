"""Torch engine on an 8-turn agent workload, prefix cache on vs off, in one run.

Workload (the shape of a multi-turn tool-using rollout, no sandbox): 4 trajectories share
a 300-token system prompt, each has its own 40-token task; every turn the engine samples
16 tokens, then a deterministic local "tool" appends 100 observation tokens derived from
them, and the next turn's prompt is the whole conversation so far (token ids, never
re-tokenized).  Prompts grow from 340 to about 1,250 tokens, so prefill dominates.

Two engines serve the same model, one with the radix prefix cache and one without.  They
run turn by turn in alternation (turn k on, turn k off, ...), so both share the machine's
noise.  Within a turn the trajectories' requests are all in flight at once, as a
generator runs its trajectories: the engine prefills the new prompts together (each after
its cached prefix; see docs/generator.md) and decodes the trajectories' samples as one
batch.

- reusable prompt tokens of a request: its longest common prefix with any request sent
  before it in the same run (earlier prompts, and earlier prompts + outputs once
  answered), at most all but its last token, which must run to give the next logits:
  what an ideal prefix cache could serve.
- cached: what the engine reports it served from its prefix cache.

Then every recorded prompt is replayed on both lanes with one new token each, from a
flushed cache: the speed-up of prompt processing alone (time to first token), which is
what the prefix cache shortens; the whole-workload figure also holds the decode steps,
which no prefix cache can shorten.  On these CPUs a float32 decode step is bound by
reading the weights, so the trajectories' rows decoded together cost about one step.

Goals (issue 4): >= 90% of reusable prompt tokens served from cache, and >= 3x faster
than cache off (the whole workload).  Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from agent_workload import (
    TRAJECTORIES,
    TURNS,
    VOCAB,
    Workload,
    first_prompts,
    reusable,
    tokens,
    tool_output,
)
from transformers.utils import logging as hf_logging

from services.engines.engine import GenerateRequest, Sample, Sampling
from services.engines.torch.engine import TorchEngine
from services.runtime import logs

#: The policy: a random Qwen2 wider than `temper model init`'s so that prefill weighs
#: what it does in real models (at hidden 128 a decode step costs ~50 prefill tokens).
LAYERS = 2
HIDDEN = 768
GOAL_CACHED = 0.90
GOAL_SPEEDUP = 3.0


@dataclass
class Lane:
    """One engine's figures over the whole run."""

    name: str
    wall_s: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    reusable_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    #: prompt + output of every request so far (to measure what was reusable).
    seen: list[list[int]] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    #: The same prompts again with one new token each: prompt processing alone.
    first_token_s: float = 0.0

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / self.reusable_tokens if self.reusable_tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.wall_s if self.wall_s else 0.0


# ---------------------------------------------------------------- workload


# ---------------------------------------------------------------- running


def submitted(lane: Lane, prompt: list[int]) -> None:
    """What an ideal cache could serve of ``prompt``: measured against everything sent
    before it, in submission order: what a cache could hold by then, had the requests
    been prefilled one after another."""
    lane.reusable_tokens += reusable(prompt, lane.seen)
    lane.seen.append(list(prompt))
    lane.requests += 1
    lane.prompt_tokens += len(prompt)
    lane.prompts.append(list(prompt))


def answered(lane: Lane, prompt: list[int], sample: Sample) -> None:
    lane.cached_tokens += sample.cached_tokens
    lane.generated_tokens += len(sample.output_ids)
    lane.seen.append(prompt + sample.output_ids)
    lane.outputs.append(sample.output_ids)


async def one_turn(
    lane: Lane, engine: TorchEngine, prompts: list[list[int]], turn: int, work: Workload
) -> None:
    """Every trajectory's request of one turn, all in flight at once (as a generator runs
    its trajectories); extends ``prompts`` in place."""
    requests = []
    for t, prompt in enumerate(prompts):
        submitted(lane, prompt)
        sampling = Sampling(temperature=1.0, max_new_tokens=work.new_tokens, seed=1000 * t + turn)
        requests.append(GenerateRequest(prompt_ids=list(prompt), sampling=sampling))
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(r) for r in requests))
    lane.wall_s += time.perf_counter() - started
    for t, (prompt, [sample]) in enumerate(zip(prompts, results, strict=True)):
        answered(lane, prompt, sample)
        observation = tool_output(t, turn, sample.output_ids, work.tool_tokens)
        prompt.extend([*sample.output_ids, *observation])


async def run_bench(model_dir: Path, work: Workload) -> tuple[Lane, Lane]:
    on = TorchEngine(model_dir, device="cpu")
    off = TorchEngine(model_dir, device="cpu", cache_bytes=0)
    await on.start()
    await off.start()
    lanes = (Lane("cache on"), Lane("cache off"))
    conversations = (first_prompts(work), first_prompts(work))
    try:
        await warm_up(on, off)
        for turn in range(work.turns):
            for lane, engine, prompts in zip(lanes, (on, off), conversations, strict=True):
                await one_turn(lane, engine, prompts, turn, work)
        await first_token_pass(lanes, (on, off))
    finally:
        await on.close()
        await off.close()
    return lanes


async def first_token_pass(lanes: Sequence[Lane], engines: Sequence[TorchEngine]) -> None:
    """Replay every recorded prompt with one new token, from a flushed cache.

    What the prefix cache saves directly (time to first token), without the decode steps
    that it cannot shorten.  Request by request in alternation between the lanes.
    """
    for engine in engines:
        await flush(engine)
    greedy = Sampling(temperature=0.0, max_new_tokens=1)
    for i in range(len(lanes[0].prompts)):
        for lane, engine in zip(lanes, engines, strict=True):
            request = GenerateRequest(prompt_ids=lane.prompts[i], sampling=greedy)
            started = time.perf_counter()
            await engine.generate(request)
            lane.first_token_s += time.perf_counter() - started


async def warm_up(*engines: TorchEngine) -> None:
    """One short request each (first-call costs), then a clean prefix cache."""
    for engine in engines:
        await engine.generate(GenerateRequest(prompt_ids=tokens(7, 32)))
        await flush(engine)


async def flush(engine: TorchEngine) -> None:
    """Empty the prefix cache: reloading the same weights is a weight update."""
    await engine.load_weights(engine.version, str(engine.model_dir))


def build_model(path: Path, layers: int = LAYERS, hidden: int = HIDDEN) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=4 * hidden,  # the MLP ratio of real models (Qwen2: ~5)
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 2),  # head_dim 64, as in real models
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(str(path))
    return path


# ---------------------------------------------------------------- report


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def render(on: Lane, off: Lane, work: Workload, model: str) -> list[str]:
    """The table; pure, so it is testable without running a model."""
    speedup = off.wall_s / on.wall_s if on.wall_s else 0.0
    first_token = off.first_token_s / on.first_token_s if on.first_token_s else 0.0
    same = on.outputs == off.outputs
    lines = [
        f"torch engine, {model}, {torch.get_num_threads()} torch threads, float32 CPU",
        f"workload: {work.trajectories} trajectories x {work.turns} turns, system prompt "
        f"{work.system_tokens}, tool outputs {work.tool_tokens}, {work.new_tokens} new tokens/turn",
        "",
        f"  {'':<10}{'wall s':>9}{'gen tok/s':>11}{'prompt tok/s':>14}"
        f"{'prompt':>9}{'reusable':>10}{'cached':>9}{'1st-token s':>13}",
    ]
    for lane in (on, off):
        lines.append(
            f"  {lane.name:<10}{lane.wall_s:>9.2f}{lane.tokens_per_s:>11.1f}"
            f"{lane.prompt_tokens_per_s:>14.0f}{lane.prompt_tokens:>9}"
            f"{lane.reusable_tokens:>10}{lane.cached_tokens:>9}{lane.first_token_s:>13.2f}"
        )
    lines += [
        "",
        f"  identical sampled tokens on vs off: {'yes' if same else 'no'}",
        f"  reusable prompt tokens served from cache: {on.cached_fraction:6.1%}"
        f"  (goal >= {GOAL_CACHED:.0%})  {verdict(on.cached_fraction >= GOAL_CACHED)}",
        f"  speed-up cache on vs off:                 {speedup:6.2f}x"
        f"  (goal >= {GOAL_SPEEDUP:.0f}x)   {verdict(speedup >= GOAL_SPEEDUP)}",
        f"  speed-up of prompt processing alone:      {first_token:6.2f}x"
        "  (same prompts, 1 new token each)",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=TRAJECTORIES)
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--model", type=Path, help="an HF model directory instead of a random one")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    # Quiet: engine info logs and load progress bars would cut the table.
    logs.configure("bench-generator", level="error")
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    work = Workload(trajectories=args.trajectories, turns=args.turns)
    with tempfile.TemporaryDirectory(prefix="temper-bench-gen-") as tmp:
        if args.model is not None:
            model_dir, label = args.model, str(args.model)
        else:
            model_dir = build_model(Path(tmp) / "policy", args.layers, args.hidden)
            label = f"random Qwen2 {args.layers} layers hidden {args.hidden}"
        on, off = asyncio.run(run_bench(model_dir, work))
    print("\n".join(render(on, off, work, label)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
