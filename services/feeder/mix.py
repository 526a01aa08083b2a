"""Which domains the next tasks come from: drawn by weight, each within its in-flight bound.

A slow domain (sandboxed tests, long answers) would otherwise fill every slot while the
others wait.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

#: A domain holds at most this many times its weighted share of the in-flight tasks.
DOMAIN_SLACK = 1.5


class MixError(ValueError):
    """A mix entry that is not ``name`` or ``name=weight`` with a positive weight."""


def parse_mix(entries: tuple[str, ...] | list[str]) -> dict[str, float]:
    """``("a=2", "b")`` -> ``{"a": 2.0, "b": 1.0}``; a bad entry raises naming it."""
    weights: dict[str, float] = {}
    for entry in entries:
        name, _, raw = entry.partition("=")
        name = name.strip()
        if not name:
            raise MixError(f"mix entry {entry!r} names no domain")
        try:
            weight = float(raw) if raw.strip() else 1.0
        except ValueError:
            raise MixError(f"mix entry {entry!r}: weight {raw!r} is not a number") from None
        if not (math.isfinite(weight) and weight > 0):
            raise MixError(f"mix entry {entry!r}: weight must be positive")
        if name in weights:
            raise MixError(f"mix names {name!r} twice")
        weights[name] = weight
    return weights


def domain_bounds(in_flight: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Most tasks in flight per domain: its share of ``in_flight`` with some slack, >= 1."""
    total = sum(weights.values())
    return {
        name: max(1, math.ceil(DOMAIN_SLACK * in_flight * weight / total))
        for name, weight in weights.items()
    }


def draw_domains(
    count: int,
    weights: Mapping[str, float],
    open_tasks: Mapping[str, int],
    bounds: Mapping[str, int],
    rng: random.Random,
) -> list[str]:
    """Up to ``count`` domain names, each drawn by weight among the domains still below
    their bound (fewer when every domain is at its bound)."""
    room = {name: bounds[name] - open_tasks.get(name, 0) for name in weights}
    drawn: list[str] = []
    for _ in range(count):
        names = [name for name in weights if room[name] > 0]
        if not names:
            break
        name = rng.choices(names, [weights[n] for n in names])[0]
        room[name] -= 1
        drawn.append(name)
    return drawn
