"""Test doubles at the model boundary: engines whose turns a test scripts (a random tiny
model writes no tool calls, and a scheduling test needs turns of a known length)."""

from __future__ import annotations

from services.engines.engine import EngineStatistics, Sample


class ScriptedTurns:
    """What every scripted engine has in common; subclasses write ``generate``."""

    name = "scripted"

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def load_weights(self, version: int, source: str) -> None:
        return None

    async def healthy(self) -> bool:
        return True

    def statistics(self) -> EngineStatistics:
        return EngineStatistics()

    def batch_statistics(self) -> dict[str, float]:
        return {}


def stopped(ids: list[int], n: int, *, version: int = 0) -> list[Sample]:
    """``n`` samples of ``ids`` that ended on a stop token."""
    return [
        Sample(output_ids=list(ids), logprobs=[-0.5] * len(ids), finish="stop",
               cached_tokens=0, version=version)
        for _ in range(n)
    ]  # fmt: skip


def occurrences(ids: list[int], part: list[int]) -> int:
    return sum(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))
