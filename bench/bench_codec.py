"""Encode/decode cost of one 4,000-token Rollout: the typed codec versus plain msgpack lists.

Run ``python bench/bench_codec.py``.  The rollout has 2,000 prompt and 2,000
completion tokens; the codec carries them packed (``<i4`` ids, ``<f4`` logprobs,
``u1`` mask), the baseline is the same dict with Python lists through
``msgpack.packb`` / ``msgpack.unpackb``.  Figures are the best median of several
repeats; nothing here asserts on timing.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    # Run as a script, only bench/ is on the path; the protocol package lives at the root.
    sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402

from protocol import Codec, pack_f32, pack_i32, pack_u8  # noqa: E402
from protocol.messages import (  # noqa: E402
    ChatMessage,
    FinishReason,
    Rollout,
    SamplingParams,
    Segment,
    Task,
    Timings,
    ToolCall,
)

PROMPT_TOKENS = 2_000
COMPLETION_TOKENS = 2_000
GOAL_US = 10.0
T0 = 1_767_225_600.0


@dataclass(frozen=True)
class Workload:
    rollout: Rollout
    #: The same content as a plain dict, token ids, logprobs and mask as Python lists.
    baseline: dict[str, Any]


def token_ids(count: int, seed: int) -> list[int]:
    # A fixed linear congruential sequence: realistic vocabulary-sized ids, same every run.
    ids, state = [], seed
    for _ in range(count):
        state = (state * 1_103_515_245 + 12_345) % 2**31
        ids.append(state % 151_936)
    return ids


def workload() -> Workload:
    prompt_ids = token_ids(PROMPT_TOKENS, seed=1)
    completion_ids = token_ids(COMPLETION_TOKENS, seed=2)
    # Two tool outputs of 100 tokens each: mask 0, logprob 0, as the generator writes them.
    tool_spans = [(600, 700), (1_300, 1_400)]
    mask = [0 if any(a <= i < b for a, b in tool_spans) else 1 for i in range(COMPLETION_TOKENS)]
    logprobs = [-((i % 97) / 32.0) * m for i, m in enumerate(mask)]
    task = Task(
        id="task-000123",
        domain="code",
        tier=1,
        prompt=[
            ChatMessage(role="system", content="You are a careful Python programmer. " * 10),
            ChatMessage(role="user", content="Implement the function described below. " * 150),
        ],
        tools=["python"],
        sampling=SamplingParams(temperature=1.0, top_p=0.95, max_tokens=2_048, seed=17),
        n=8,
        max_turns=3,
        max_total_tokens=8_192,
        deadline=T0 + 3_600,
        created_at=T0,
        metadata={"tests": ["assert solve(3) == 9", "assert solve(0) == 0"], "difficulty": 0.5},
    )
    segments = [
        Segment(start=0, end=600, kind="gen", version=41),
        Segment(start=600, end=700, kind="tool"),
        Segment(start=700, end=1_300, kind="gen", version=41),
        Segment(start=1_300, end=1_400, kind="tool"),
        Segment(start=1_400, end=2_000, kind="gen", version=42),
    ]
    tool_calls = [
        ToolCall(turn=t, name="python", arguments='{"code": "print(solve(3))"}', output="9\n" * 40)
        for t in range(2)
    ]
    rollout = Rollout(
        id="task-000123/5",
        task=task,
        sample_index=5,
        tokens=pack_i32(prompt_ids + completion_ids),
        prompt_len=PROMPT_TOKENS,
        logprobs=pack_f32(logprobs),
        loss_mask=pack_u8(mask),
        segments=segments,
        tool_calls=tool_calls,
        completion_text="def solve(n):\n    return n * n\n" * 200,
        finish_reason=FinishReason.STOP,
        timings=Timings(queued_s=0.4, generate_s=11.2, tool_s=0.3, total_s=11.9),
        cached_prompt_tokens=1_536,
        engine="sglang",
        generator="generator-3",
        created_at=T0 + 12.0,
    )
    baseline = msgpack.unpackb(Codec(Rollout).encode(rollout), raw=False)
    baseline.update(
        tokens=prompt_ids + completion_ids,
        logprobs=[float(x) for x in rollout.behaviour_logprobs],
        loss_mask=mask,
    )
    return Workload(rollout=rollout, baseline=baseline)


def best_median_us(
    operation: Callable[[], object], *, batches: int, batch: int, repeats: int
) -> float:
    """Best (over repeats) median (over batches) time per call, in microseconds."""
    medians = []
    for _ in range(repeats):
        per_call = []
        for _ in range(batches):
            start = time.perf_counter_ns()
            for _ in range(batch):
                operation()
            per_call.append((time.perf_counter_ns() - start) / batch)
        medians.append(statistics.median(per_call))
    return min(medians) / 1_000


def measure(work: Workload, *, batches: int, repeats: int) -> dict[str, float]:
    codec: Codec[Rollout] = Codec(Rollout)
    ours = codec.encode(work.rollout)
    theirs = msgpack.packb(work.baseline, use_bin_type=True)
    # Timing a wrong result would be meaningless: check both paths first.
    assert codec.decode(ours) == work.rollout
    assert msgpack.unpackb(theirs, raw=False) == work.baseline
    runs: dict[str, tuple[Callable[[], object], int]] = {
        "our_encode": (lambda: codec.encode(work.rollout), 20),
        "our_decode": (lambda: codec.decode(ours), 20),
        "base_encode": (lambda: msgpack.packb(work.baseline, use_bin_type=True), 2),
        "base_decode": (lambda: msgpack.unpackb(theirs, raw=False), 2),
    }
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection landing in one batch would skew that batch, not the cost
    try:
        figures = {
            name: best_median_us(op, batches=batches, batch=size, repeats=repeats)
            for name, (op, size) in runs.items()
        }
    finally:
        if gc_was_enabled:
            gc.enable()
    figures["our_bytes"] = len(ours)
    figures["base_bytes"] = len(theirs)
    return figures


def report(figures: dict[str, float]) -> str:
    enc_ratio = figures["base_encode"] / figures["our_encode"]
    dec_ratio = figures["base_decode"] / figures["our_decode"]
    ok = figures["our_encode"] <= GOAL_US and figures["our_decode"] <= GOAL_US
    lines = [
        f"Rollout, {PROMPT_TOKENS} prompt + {COMPLETION_TOKENS} completion tokens "
        f"(python {sys.version.split()[0]}, msgpack {'.'.join(map(str, msgpack.version))})",
        f"{'':22}{'encode µs':>12}{'decode µs':>12}{'bytes':>10}",
        f"{'protocol.Codec':22}{figures['our_encode']:12.2f}{figures['our_decode']:12.2f}"
        f"{figures['our_bytes']:10.0f}",
        f"{'msgpack + lists':22}{figures['base_encode']:12.2f}{figures['base_decode']:12.2f}"
        f"{figures['base_bytes']:10.0f}",
        f"{'speed-up (base/ours)':22}{enc_ratio:11.1f}x{dec_ratio:11.1f}x",
        f"goal: <= {GOAL_US:g} µs each way: {'PASS' if ok else 'MISS'}",
    ]
    return "\n".join(lines)


def main(*, batches: int = 50, repeats: int = 5) -> int:
    print(report(measure(workload(), batches=batches, repeats=repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
