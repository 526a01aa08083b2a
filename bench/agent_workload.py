"""The 8-turn agent-style workload shared by the generator benchmarks (torch and SGLang).

Trajectories share a system prompt and each has its own task; every turn the engine
samples a few tokens, then a deterministic local "tool" appends observation tokens
derived from them, and the next turn's prompt is the whole conversation so far.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

VOCAB = 2048
SYSTEM_TOKENS = 300
TASK_TOKENS = 40
TOOL_TOKENS = 100
NEW_TOKENS = 16
TRAJECTORIES = 4
TURNS = 8


@dataclass(frozen=True)
class Workload:
    trajectories: int = TRAJECTORIES
    turns: int = TURNS
    system_tokens: int = SYSTEM_TOKENS
    task_tokens: int = TASK_TOKENS
    tool_tokens: int = TOOL_TOKENS
    new_tokens: int = NEW_TOKENS


def tokens(seed: int, count: int) -> list[int]:
    """``count`` pseudo-random ordinary token ids (no special ids below 10)."""
    rng = random.Random(seed)
    return [rng.randrange(10, VOCAB) for _ in range(count)]


def tool_output(trajectory: int, turn: int, output: Sequence[int], count: int) -> list[int]:
    """The deterministic local tool: an observation derived from the call's tokens."""
    digest = zlib.crc32(f"{trajectory}/{turn}/{list(output)}".encode())
    return tokens(digest, count)


def first_prompts(work: Workload) -> list[list[int]]:
    system = tokens(0, work.system_tokens)
    return [system + tokens(1000 + t, work.task_tokens) for t in range(work.trajectories)]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def reusable(prompt: Sequence[int], seen: Sequence[Sequence[int]]) -> int:
    """What an ideal prefix cache could serve: the longest common prefix with anything
    seen before, leaving the prompt's last token to run."""
    best = max((common_prefix(prompt, s) for s in seen), default=0)
    return min(best, len(prompt) - 1)
