"""Weighted composition: a domain's validators judge a rollout; their scores make its reward.

reward = sum(weight x score) over the domain's validators, when every one of them
scored.  If any hit an infrastructure failure (it raised, timed out, or the
sandbox failed) the rollout is ``infra_failure`` with no reward; otherwise if any
found it unjudgeable it is ``invalid``.  Every validator's outcome is listed in
``details`` either way.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from protocol.messages import Rollout, RolloutStatus, ScoredRollout, ScoreStatus, ValidatorDetail
from services.domains import ranges
from services.domains.api import Domain
from services.domains.ranges import ScoreRange
from services.domains.registry import DomainRegistry
from services.validator import factory
from services.validator.base import InfraFailure, InvalidRollout, RuleValidator, Validator, Verdict
from services.validator.factory import Resources

#: Told about every validator run: (kind, status, seconds).
Observer = Callable[[str, ScoreStatus, float], None]


def _ignore(kind: str, status: ScoreStatus, seconds: float) -> None:
    return None


@dataclass(frozen=True)
class Judge:
    name: str
    kind: str
    weight: float
    timeout_s: float
    validator: Validator
    #: The validator's declared range: a score outside it is clamped and flagged.
    score_range: ScoreRange = ranges.UNIT


class Judgement(NamedTuple):
    """What a rollout's validators made of it (a tuple: built for every rollout)."""

    reward: float
    status: ScoreStatus
    details: list[ValidatorDetail]
    error: str | None = None

    def clamped(self) -> list[ValidatorDetail]:
        """The details whose validator scored outside its declared range."""
        return [d for d in self.details if d.clamped_from is not None]


async def _verdict(judge: Judge, rollout: Rollout) -> Verdict:
    async with asyncio.timeout(judge.timeout_s):
        return await judge.validator.score(rollout)


async def run_judge(judge: Judge, rollout: Rollout, observe: Observer = _ignore) -> ValidatorDetail:
    """One validator's detail; whatever goes wrong becomes a status, never an exception."""
    if isinstance(judge.validator, RuleValidator):
        return run_rule(judge, judge.validator, rollout, observe)
    started = time.perf_counter()
    try:
        outcome = _scored(judge, await _verdict(judge, rollout))
    except Exception as error:
        outcome = _failure(judge, error)
    return _detail(judge, outcome, started, observe)


def run_rule(
    judge: Judge, rule: RuleValidator, rollout: Rollout, observe: Observer = _ignore
) -> ValidatorDetail:
    """:func:`run_judge` for a rule validator, without a coroutine.

    Synchronous and linear in the text: a timeout could not interrupt it anyway, and
    arming one costs more than the check.
    """
    started = time.perf_counter()
    try:
        outcome = _scored(judge, rule.check(rollout))
    except Exception as error:
        outcome = _failure(judge, error)
    return _detail(judge, outcome, started, observe)


class _Outcome(NamedTuple):
    """What one validator run came to, before it becomes a ValidatorDetail."""

    status: ScoreStatus
    score: float
    message: str
    preview: bytes | None = None
    #: The score as given, when it was outside the validator's range and got clamped.
    clamped_from: float | None = None


def _scored(judge: Judge, verdict: Verdict) -> _Outcome:
    score, allowed = verdict.score, judge.score_range
    if not math.isfinite(score):
        return _Outcome(ScoreStatus.INFRA_FAILURE, 0.0, f"non-finite score {score}")
    if allowed.contains(score):
        return _Outcome(ScoreStatus.SCORED, score, verdict.message, verdict.preview)
    # A validator bug, or a candidate that took over what reports to it: never a reward
    # out of scale.  The service flags it (metric, error event).
    clamped = allowed.clamp(score)
    message = f"score {score:g} outside the range {allowed}, clamped to {clamped:g}; "
    return _Outcome(ScoreStatus.SCORED, clamped, message + verdict.message, verdict.preview, score)


def _failure(judge: Judge, error: Exception) -> _Outcome:
    if isinstance(error, InvalidRollout):
        return _Outcome(ScoreStatus.INVALID, 0.0, str(error))
    if isinstance(error, InfraFailure):
        return _Outcome(ScoreStatus.INFRA_FAILURE, 0.0, str(error))
    if isinstance(error, TimeoutError):
        return _Outcome(ScoreStatus.INFRA_FAILURE, 0.0, f"timed out after {judge.timeout_s:g}s")
    # A validator bug or a machinery failure: typed, not a crash.
    return _Outcome(ScoreStatus.INFRA_FAILURE, 0.0, f"{type(error).__name__}: {error}")


def _detail(judge: Judge, outcome: _Outcome, started: float, observe: Observer) -> ValidatorDetail:
    observe(judge.kind, outcome.status, time.perf_counter() - started)
    return ValidatorDetail(
        name=judge.name,
        score=outcome.score,
        weight=judge.weight,
        status=outcome.status,
        message=outcome.message,
        preview=outcome.preview,
        clamped_from=outcome.clamped_from,
    )


def combine(details: list[ValidatorDetail]) -> Judgement:
    reward = 0.0
    for detail in details:
        if detail.status is not ScoreStatus.SCORED:
            return _unscored(details)
        reward += detail.weight * detail.score
    return Judgement(reward, ScoreStatus.SCORED, details)


def _unscored(details: list[ValidatorDetail]) -> Judgement:
    """Some validator did not score: an infra failure if any failed so, else invalid."""
    infra = any(d.status is ScoreStatus.INFRA_FAILURE for d in details)
    status = ScoreStatus.INFRA_FAILURE if infra else ScoreStatus.INVALID
    error = "; ".join(f"{d.name}: {d.message}" for d in details if d.status is status)
    return Judgement(0.0, status, details, error)


@dataclass(frozen=True)
class Panel:
    """The judges of one domain."""

    domain: Domain
    judges: tuple[Judge, ...]

    @functools.cached_property
    def rules(self) -> list[tuple[Judge, RuleValidator]] | None:
        """Every judge with its rule validator, or None if any judge waits on something."""
        rules = [(j, j.validator) for j in self.judges if isinstance(j.validator, RuleValidator)]
        return rules if len(rules) == len(self.judges) else None

    def judge_now(self, rollout: Rollout, observe: Observer = _ignore) -> Judgement:
        """:meth:`judge` without a coroutine, for a panel of rule validators only."""
        if self.rules is None:
            raise ValueError(f"domain {self.domain.name!r} has validators that wait")
        return combine([run_rule(judge, rule, rollout, observe) for judge, rule in self.rules])

    async def judge(self, rollout: Rollout, observe: Observer = _ignore) -> Judgement:
        if len(self.judges) == 1:  # the common case: no gather, no extra tasks
            return combine([await run_judge(self.judges[0], rollout, observe)])
        details = await asyncio.gather(*(run_judge(j, rollout, observe) for j in self.judges))
        return combine(list(details))


def build_panel(
    domain: Domain, resources: Resources, timeout_s: float, plugins: Mapping[str, str]
) -> Panel:
    judges = tuple(
        Judge(
            name=spec.label,
            kind=spec.kind,
            weight=spec.weight,
            timeout_s=factory.timeout_of(spec, timeout_s),
            validator=factory.build(spec, domain, resources, plugins),
            score_range=ranges.declared(spec, domain.name),
        )
        for spec in domain.validators
    )
    return Panel(domain, judges)


class Scorer:
    """Rollout -> ScoredRollout for every domain of a registry."""

    def __init__(
        self,
        registry: DomainRegistry,
        resources: Resources,
        *,
        timeout_s: float,
        validator: str,
        observe: Observer = _ignore,
        plugins: Mapping[str, str] | None = None,
    ) -> None:
        kinds = factory.plugin_kinds() if plugins is None else plugins
        self.panels = {d.name: build_panel(d, resources, timeout_s, kinds) for d in registry}
        self.validator = validator
        self._observe = observe

    def inline(self, domain: str) -> bool:
        """Whether rollouts of ``domain`` are judged without waiting (by :meth:`judge_now`)."""
        panel = self.panels.get(domain)
        return panel is None or panel.rules is not None

    async def score(self, rollout: Rollout) -> ScoredRollout:
        judgement = await self.judge(rollout)
        return ScoredRollout(
            id=rollout.id,
            rollout=rollout,
            reward=judgement.reward,
            status=judgement.status,
            details=judgement.details,
            error=judgement.error,
            validator=self.validator,
            scored_at=time.time(),
        )

    async def judge(self, rollout: Rollout) -> Judgement:
        early = self._unjudged(rollout)
        if early is not None:
            return early
        return await self.panels[rollout.task.domain].judge(rollout, self._observe)

    def judge_now(self, rollout: Rollout) -> Judgement:
        """:meth:`judge` for a rollout of a domain judged :meth:`inline`, without a coroutine."""
        early = self._unjudged(rollout)
        if early is not None:
            return early
        return self.panels[rollout.task.domain].judge_now(rollout, self._observe)

    def _unjudged(self, rollout: Rollout) -> Judgement | None:
        """The judgement of a rollout no validator gets to see, else None."""
        if rollout.status is RolloutStatus.INVALID:
            return Judgement(
                0.0, ScoreStatus.INVALID, [], rollout.error or "the rollout is invalid"
            )
        if rollout.status is RolloutStatus.INFRA_FAILURE:
            error = rollout.error or "generation failed"
            return Judgement(0.0, ScoreStatus.INFRA_FAILURE, [], error)
        if rollout.task.domain not in self.panels:
            error = f"unknown domain {rollout.task.domain!r} ({len(self.panels)} domains known)"
            return Judgement(0.0, ScoreStatus.INVALID, [], error)
        return None
