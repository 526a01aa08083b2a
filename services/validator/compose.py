"""Weighted composition: a domain's validators judge a rollout; their scores make its reward.

reward = sum(weight x score) over the domain's validators, when every one of them
scored.  If any hit an infrastructure failure (it raised, timed out, or the
sandbox failed) the rollout is ``infra_failure`` with no reward; otherwise if any
found it unjudgeable it is ``invalid``.  Every validator's outcome is listed in
``details`` either way.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from protocol.messages import Rollout, RolloutStatus, ScoredRollout, ScoreStatus, ValidatorDetail
from services.domains.api import Domain
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


@dataclass(frozen=True)
class Judgement:
    reward: float
    status: ScoreStatus
    details: list[ValidatorDetail]
    error: str | None = None


async def _verdict(judge: Judge, rollout: Rollout) -> Verdict:
    if isinstance(judge.validator, RuleValidator):
        # Synchronous and linear in the text: a timeout could not interrupt it anyway,
        # and arming one costs more than the check.
        return judge.validator.check(rollout)
    async with asyncio.timeout(judge.timeout_s):
        return await judge.validator.score(rollout)


async def run_judge(judge: Judge, rollout: Rollout, observe: Observer = _ignore) -> ValidatorDetail:
    """One validator's detail; whatever goes wrong becomes a status, never an exception."""
    started = time.perf_counter()
    status, score, message = ScoreStatus.SCORED, 0.0, ""
    try:
        verdict = await _verdict(judge, rollout)
        score, message = verdict.score, verdict.message
        if not math.isfinite(score):
            status, score, message = ScoreStatus.INFRA_FAILURE, 0.0, f"non-finite score {score}"
    except InvalidRollout as error:
        status, message = ScoreStatus.INVALID, str(error)
    except InfraFailure as error:
        status, message = ScoreStatus.INFRA_FAILURE, str(error)
    except TimeoutError:
        status, message = ScoreStatus.INFRA_FAILURE, f"timed out after {judge.timeout_s:g}s"
    except Exception as error:  # a validator bug or a machinery failure: typed, not a crash
        status, message = ScoreStatus.INFRA_FAILURE, f"{type(error).__name__}: {error}"
    observe(judge.kind, status, time.perf_counter() - started)
    return ValidatorDetail(
        name=judge.name, score=score, weight=judge.weight, status=status, message=message
    )


def combine(details: list[ValidatorDetail]) -> Judgement:
    for status in (ScoreStatus.INFRA_FAILURE, ScoreStatus.INVALID):
        failed = [d for d in details if d.status is status]
        if failed:
            error = "; ".join(f"{d.name}: {d.message}" for d in failed)
            return Judgement(0.0, status, details, error)
    return Judgement(sum(d.weight * d.score for d in details), ScoreStatus.SCORED, details)


@dataclass(frozen=True)
class Panel:
    """The judges of one domain."""

    domain: Domain
    judges: tuple[Judge, ...]

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
        if rollout.status is RolloutStatus.INVALID:
            return Judgement(
                0.0, ScoreStatus.INVALID, [], rollout.error or "the rollout is invalid"
            )
        if rollout.status is RolloutStatus.INFRA_FAILURE:
            error = rollout.error or "generation failed"
            return Judgement(0.0, ScoreStatus.INFRA_FAILURE, [], error)
        panel = self.panels.get(rollout.task.domain)
        if panel is None:
            error = f"unknown domain {rollout.task.domain!r} ({len(self.panels)} domains known)"
            return Judgement(0.0, ScoreStatus.INVALID, [], error)
        return await panel.judge(rollout, self._observe)
