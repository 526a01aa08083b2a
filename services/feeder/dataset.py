"""A domain as a finite dataset the feeder walks epoch by epoch.

The dataset is the domain's distinct training problems for the run's seed, in a fixed
order; each epoch visits all of them in its own seeded order.  A visit either takes the
problem or passes over it (its pool, or the filter), and the decision is a function of
the saved state and the visit's place, so a restarted feeder decides as the first did.

A problem may be written several ways (``4+9+3`` and ``3+9+4`` are one problem, one key).
The draws keep every spelling they met, and each epoch asks a problem in one of them,
written another way again where the domain can (``Domain.respelled``): a policy shown one
spelling twenty times learns that string's answer, while shown twenty it has to learn the
problem (TRL on ``arithmetic_sum4``, the same 518 problems: 57% held-out after 10 minutes
on 1,797 spellings, 81-85% on 7,366).  The spelling is again a function of the
visit's place, so a restart changes nothing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from services.domains import Domain
from services.domains.api import Problem
from services.feeder.settings import FeederSettings
from services.feeder.state import Cursor, DomainState

Pool = Literal["easy", "normal", "hard"]
POOLS: tuple[Pool, ...] = ("easy", "normal", "hard")


def pool_of(rate: float | None, settings: FeederSettings) -> Pool:
    """A problem's pool from its last pass rate; one never scored is normal."""
    if rate is None:
        return "normal"
    if rate >= settings.easy_at:
        return "easy"
    if rate <= settings.hard_at:
        return "hard"
    return "normal"


@dataclass(frozen=True, kw_only=True)
class Visit:
    """Where the cursor goes next: the problem it takes (None: it took none in a whole
    epoch's worth of visits) and what it passed over on the way."""

    problem: Problem | None
    at: Cursor
    after: Cursor
    passed_over: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Dataset:
    domain: Domain
    #: One per distinct problem (key), as first drawn.
    problems: tuple[Problem, ...]
    seed: int
    #: Every distinct spelling drawn of each problem, first one first (same index).
    spellings: tuple[tuple[Problem, ...], ...] = ()
    _orders: dict[int, list[int]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, domain: Domain, size: int, seed: int) -> Dataset:
        seen: dict[str, dict[str, Problem]] = {}
        for problem in domain.problems(size, "train", seed=seed):
            seen.setdefault(problem.key, {}).setdefault(problem.question, problem)
        spellings = tuple(tuple(by_text.values()) for by_text in seen.values())
        return cls(domain, tuple(s[0] for s in spellings), seed, spellings)

    def spelling(self, index: int, epoch: int) -> Problem:
        """Problem ``index`` as epoch ``epoch`` asks it: one of its drawn spellings, written
        another way again where the domain knows how."""
        variants = self.spellings[index] if self.spellings else (self.problems[index],)
        pick = random.Random(f"{self.seed}:{self.domain.name}:{epoch}:spelling:{index}")
        return self.domain.respelled(variants[pick.randrange(len(variants))], pick)

    def order(self, epoch: int) -> list[int]:
        """Epoch ``epoch``'s visiting order (the same in every process)."""
        if epoch not in self._orders:
            order = list(range(len(self.problems)))
            random.Random(f"{self.seed}:{self.domain.name}:{epoch}").shuffle(order)
            self._orders.clear()  # one epoch at a time is all a cursor needs
            self._orders[epoch] = order
        return self._orders[epoch]

    def next(self, state: DomainState, settings: FeederSettings) -> Visit:
        """The next problem to publish from ``state``'s cursor; the state is not changed."""
        cursor = Cursor(state.cursor.epoch, state.cursor.index)
        passed: dict[str, int] = {}
        for _ in range(len(self.problems)):
            at = Cursor(cursor.epoch, cursor.index)
            index = self.order(at.epoch)[at.index]
            cursor = _advance(at, len(self.problems))
            reason = self._pass_over(self.problems[index].key, at, state, settings)
            if reason is None:
                problem = self.spelling(index, at.epoch)
                return Visit(problem=problem, at=at, after=cursor, passed_over=passed)
            passed[reason] = passed.get(reason, 0) + 1
        return Visit(problem=None, at=cursor, after=cursor, passed_over=passed)

    def _pass_over(
        self, key: str, at: Cursor, state: DomainState, settings: FeederSettings
    ) -> str | None:
        """Why the visit at ``at`` does not take ``key``; None when it does."""
        if key in state.skipped:
            return "skipped"
        if state.later.get(key, 0) > at.epoch:
            return "later"
        pool = pool_of(state.pass_rate.get(key), settings)
        take = {"easy": settings.easy_take, "normal": 1.0, "hard": settings.hard_take}[pool]
        if take >= 1.0:
            return None
        draw = random.Random(f"{self.seed}:{self.domain.name}:{at.epoch}:{at.index}").random()
        return None if draw < take else pool


def moved(state: DomainState, visit: Visit) -> None:
    """``state`` once ``visit`` is done (its problem, if any, published)."""
    state.cursor = visit.after
    for reason, count in visit.passed_over.items():
        state.passed_over[reason] = state.passed_over.get(reason, 0) + count
    if visit.problem is not None:
        state.drawn += 1


def _advance(cursor: Cursor, size: int) -> Cursor:
    if cursor.index + 1 < size:
        return Cursor(cursor.epoch, cursor.index + 1)
    return Cursor(cursor.epoch + 1, 0)


def pool_sizes(dataset: Dataset, state: DomainState, settings: FeederSettings) -> dict[Pool, int]:
    sizes: dict[Pool, int] = dict.fromkeys(POOLS, 0)
    for problem in dataset.problems:
        sizes[pool_of(state.pass_rate.get(problem.key), settings)] += 1
    return sizes
