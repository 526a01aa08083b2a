"""Scores out of scale: whatever a validator returns (a bug, or a candidate that took over
what reports to it), the stored reward stays in the validator's declared range, the case
is flagged with the rollout id, and the learner refuses a reward outside its domain's range.
"""

from __future__ import annotations

import random

import pytest

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.errors import ErrorCode
from protocol.messages import ErrorEvent, ScoredRollout, ScoreStatus
from services.domains import Domain, DomainRegistry, Problem, ValidatorSpec
from services.domains.params import Params
from services.validator import ValidatorService
from services.validator.base import Validator, Verdict
from services.validator.factory import Resources
from tests.integration.support import Inbox, client, stream_entries, wait_count
from tests.integration.test_validator_service import make_rollout, publish, settings

SCORED: Codec[ScoredRollout] = Codec(ScoredRollout)


class Says:
    """A validator that returns whatever its domain tells it to."""

    def __init__(self, value: float) -> None:
        self.value = value

    async def score(self, rollout: object) -> Verdict:
        return Verdict(self.value, "as told")


def says(params: Params, domain: Domain, resources: Resources) -> Validator:
    """A plugin kind, ``tests.adversarial.test_bounds:says`` in specs."""
    return Says(params.number("value", 0.0, -1e9, 1e9))


class OneProblem:
    def draw(self, rng: random.Random) -> Problem:
        return Problem(key="k", question="q", metadata={})


def domain(name: str, value: float, **params: object) -> Domain:
    spec = ValidatorSpec(kind=f"{__name__}:says", params={"value": value, **params})
    return Domain(name=name, source=OneProblem(), validators=(spec,))


@pytest.mark.parametrize(("value", "stored"), [(17.0, 1.0), (-3.0, 0.0)])
async def test_a_score_out_of_range_is_clamped_flagged_and_named(
    nats_url: str, value: float, stored: float
) -> None:
    registry = DomainRegistry([domain("inflated", value)])
    async with ValidatorService(settings(nats_url), registry) as service, client(nats_url) as nc:
        js = nc.jetstream()
        events = await Inbox.open(nc, subjects.error_event("validator"))
        task = registry.get("inflated").make_tasks(1)[0]
        rollout = make_rollout(task, "anything")
        await publish(js, rollout)
        await wait_count(js, streams.SCORED.name, 1)
        [entry] = await stream_entries(js, streams.SCORED.name)
        scored = SCORED.decode(entry.data)
        assert (scored.status, scored.reward) == (ScoreStatus.SCORED, stored)
        [detail] = scored.details
        assert (detail.score, detail.clamped_from) == (stored, value)
        event = await events.until(lambda m: isinstance(m, ErrorEvent))
        assert isinstance(event, ErrorEvent)
        assert event.code is ErrorCode.VALIDATION and event.field == "$.details[0].score"
        assert rollout.id in event.message and f"{value:g}" in event.message
        assert service.clamped == 1
        metric = 'temper_validator_clamped_total{domain="inflated",validator='
        assert metric in service.metrics.render().decode()


async def test_a_declared_range_is_honoured_not_clamped(nats_url: str) -> None:
    registry = DomainRegistry([domain("wide", 17.0, score_range=[0, 20])])
    async with ValidatorService(settings(nats_url), registry) as service, client(nats_url) as nc:
        js = nc.jetstream()
        await publish(js, make_rollout(registry.get("wide").make_tasks(1)[0], "x"))
        await wait_count(js, streams.SCORED.name, 1)
        [entry] = await stream_entries(js, streams.SCORED.name)
        scored = SCORED.decode(entry.data)
        assert (scored.reward, scored.details[0].clamped_from, service.clamped) == (17.0, None, 0)
