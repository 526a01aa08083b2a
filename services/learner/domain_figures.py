"""Per-domain figures of a learner step, for the reward-hacking watch: how many samples sat
at the domain's top score, how long they were against the rest, and the reward histogram.

A policy that games a reward often finds a short way to the top score (a forged harness
line, an answer echoed from the prompt); a reward distribution that jumps between two
versions is another sign.  Both need more than a batch mean, and cost a pass over the
batch's rewards.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from protocol.messages import ScoredRollout
from services.domains.ranges import ScoreRange
from services.evaluation.figures import BINS, DomainFigures
from services.learner.reward_bounds import RewardBounds

#: A reward this close to the top of the range counts as the top score.
AT_TOP: Final = 1e-6


def bin_of(reward: float, allowed: ScoreRange) -> int:
    width = allowed.high - allowed.low
    if width <= 0:
        return 0
    place = int((allowed.clamp(reward) - allowed.low) / width * BINS)
    return min(place, BINS - 1)


def figures(items: Iterable[ScoredRollout], bounds: RewardBounds) -> dict[str, DomainFigures]:
    by_domain: dict[str, list[tuple[float, int]]] = {}
    for item in items:
        length = len(item.rollout.logprobs) // 4
        by_domain.setdefault(item.rollout.task.domain, []).append((item.reward, length))
    return {d: _figures(pairs, bounds.of(d)) for d, pairs in sorted(by_domain.items())}


def _figures(pairs: list[tuple[float, int]], allowed: ScoreRange) -> DomainFigures:
    histogram = [0] * BINS
    for reward, _ in pairs:
        histogram[bin_of(reward, allowed)] += 1
    top = [length for reward, length in pairs if reward >= allowed.high - AT_TOP]
    return DomainFigures(
        samples=len(pairs),
        at_top=len(top),
        top_len=sum(top) / len(top) if top else 0.0,
        len_mean=sum(length for _, length in pairs) / len(pairs),
        histogram=tuple(histogram),
    )
