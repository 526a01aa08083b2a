"""The validator service: Rollout -> ScoredRollout, for every domain of its registry.

Instances share one durable pull consumer on TEMPER_ROLLOUTS (their queue group).
Each rollout is judged by its domain's validators, and its ScoredRollout is
published to ``temper.v1.scored.<domain>.<task_id>`` with ``Nats-Msg-Id`` = the
rollout id, so a rollout judged twice (redelivered after a crash) is stored once;
the rollout is acked only after that publish is stored.

Outcomes: ``scored`` with a reward; ``infra_failure`` when the judging machinery
failed (or the rollout itself was an infra failure); ``invalid`` when the rollout
cannot be judged: it was invalid already, its task lacks reference data, or its
domain is unknown here.  An unknown domain is a result, not a dead letter: the
client waiting for the task's ``n`` results gets a terminal answer.  Bytes that
are not a valid Rollout go to the dead-letter stream (the runtime does that).

The service consumes in the runtime's batch mode: a fetch of rule-judged rollouts is
judged inline and its results go out in one pipelined publish (each with its own stream
ack); a rollout whose domain waits on the sandbox or a reward model is judged on its own
and settled when done.  See docs/validator.md, "Benchmark", for why.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import msgspec

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.errors import ErrorCode, PayloadTooLarge
from protocol.messages import Message, Rollout, ScoredRollout, ScoreStatus, ValidatorDetail
from services.domains import DomainRegistry, load_registry
from services.runtime import (
    ConsumerSpec,
    ConsumerTuning,
    Delivery,
    Outcome,
    Publication,
    PublishResult,
    Reject,
    Result,
    Service,
    StreamAck,
)
from services.runtime.bus import message_headers
from services.validator.base import RuleValidator
from services.validator.compose import Scorer
from services.validator.factory import Resources, RewardModels
from services.validator.sandbox import NatsSandbox
from services.validator.settings import ValidatorSettings
from services.validator.stats import DomainStats

#: Batches per instance in flight at once: one is judged while others wait for their acks.
BATCHES_IN_FLIGHT = 4


class ScoredWire(Message, tag="scored_rollout"):
    """A ScoredRollout as it goes on the wire, the rollout in the bytes it arrived in.

    Those bytes just decoded as a valid Rollout, so every reader decodes this as an
    ordinary ScoredRollout (same tag, same fields, in the same order); re-encoding the
    rollout (its task, tokens and logprobs) would cost more than judging it.
    """

    id: str
    rollout: msgspec.Raw
    reward: float = 0.0
    status: ScoreStatus = ScoreStatus.SCORED
    details: list[ValidatorDetail] = []
    error: str | None = None
    validator: str = ""
    scored_at: float | None = None


class ValidatorService(Service):
    name = "validator"
    streams = (streams.ROLLOUTS, streams.SCORED, streams.ERRORS, streams.DEAD_LETTERS)

    def __init__(self, settings: ValidatorSettings, domains: DomainRegistry | None = None) -> None:
        super().__init__(settings.runtime)
        self.settings = settings
        self._domains = domains
        self._scorer: Scorer | None = None
        self._reward_models = RewardModels(
            max_batch=settings.reward_batch_size, max_wait_s=settings.reward_batch_wait_s
        )
        self.stats = DomainStats(self.metrics.registry)
        self.published = 0
        self.duplicates = 0
        self._waits: set[str] = set()
        self._encoder = msgspec.msgpack.Encoder()

    @property
    def domains(self) -> DomainRegistry:
        if self._domains is None:
            raise RuntimeError("the domains are loaded at start")
        return self._domains

    @property
    def scorer(self) -> Scorer:
        if self._scorer is None:
            raise RuntimeError("the validators are built at start")
        return self._scorer

    async def setup(self) -> None:
        if self._domains is None:
            self._domains = load_registry(
                self.settings.domains_config, plugins=self.settings.domain_plugins
            )
        resources = Resources(
            sandbox=NatsSandbox(self.bus.nc, self.settings.sandbox_subject),
            reward_models=self._reward_models,
            sandbox_timeout_s=self.settings.sandbox_timeout_s,
            sandbox_grace_s=self.settings.sandbox_grace_s,
        )
        self._scorer = Scorer(
            self.domains,
            resources,
            timeout_s=self.settings.validator_timeout_s,
            validator=f"{self.name}/{self.instance}",
            observe=self.stats.observe_run,
        )
        self.log.info(
            "domains_loaded",
            domains=len(self.domains),
            reward_models=len(self._reward_models.batchers),
        )
        # Domains with a validator that waits (sandbox, reward model) are judged apart, so
        # a batch's rule-judged rollouts are acked without waiting for them.
        self._waits = {
            name
            for name, panel in self.scorer.panels.items()
            if not all(isinstance(judge.validator, RuleValidator) for judge in panel.judges)
        }
        self.consume_batch(self._consumer_spec(), Codec(Rollout), self._on_rollouts, self._tuning())

    def _consumer_spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            stream=streams.ROLLOUTS.name,
            durable=self.settings.durable,
            filter_subject=subjects.rollouts(),
            ack_wait_s=self.settings.ack_wait_s,
            max_deliver=self.settings.max_deliver,
            max_ack_pending=max(1024, 4 * self.settings.max_in_flight),
        )

    def _tuning(self) -> ConsumerTuning:
        return ConsumerTuning(
            max_in_flight=self.settings.max_in_flight,
            fetch_wait_s=self.settings.fetch_wait_s,
            batch_size=max(1, self.settings.max_in_flight // BATCHES_IN_FLIGHT),
        )

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [batcher.run() for batcher in self._reward_models.batchers.values()]

    def health(self) -> tuple[bool, str]:
        healthy, _ = super().health()
        return healthy, f"{len(self._domains or ())} domains"

    def statistics(self) -> dict[str, float]:
        values = super().statistics()
        values.update(self.stats.values())
        values["published"] = float(self.published)
        values["duplicates"] = float(self.duplicates)
        batchers = self._reward_models.batchers.values()
        batches, scored = sum(b.batches for b in batchers), sum(b.scored for b in batchers)
        if batches:
            values["reward_model_batches"] = float(batches)
            values["reward_model_scored"] = float(scored)
            values["reward_model_mean_batch"] = scored / batches
        return values

    async def _on_rollouts(self, batch: list[tuple[Rollout, Delivery]]) -> list[Result]:
        """Judge a fetch: rule domains inline, then all their results in one pipelined publish."""
        results: list[Result] = [None] * len(batch)
        inline: list[int] = []
        scored: list[ScoredRollout] = []
        for index, (rollout, _) in enumerate(batch):
            if rollout.task.domain in self._waits:
                continue
            try:
                scored.append(await self.scorer.score(rollout))  # never waits: rules only
                inline.append(index)
            except Exception as error:  # a scorer bug fails this rollout, not the batch
                results[index] = error
        outcomes = await self._publish(scored, [batch[index][1] for index in inline])
        for index, outcome in zip(inline, outcomes, strict=True):
            results[index] = outcome
        # Made last, so that nothing above can raise and leave them never awaited.
        for index, (rollout, delivery) in enumerate(batch):
            if rollout.task.domain in self._waits:
                results[index] = self._judge_alone(rollout, delivery)
        return results

    async def _judge_alone(self, rollout: Rollout, delivery: Delivery) -> Outcome:
        scored = await self.scorer.score(rollout)
        [outcome] = await self._publish([scored], [delivery])
        return outcome

    async def _publish(
        self, scored: list[ScoredRollout], deliveries: list[Delivery]
    ) -> list[Outcome]:
        """Store every result in TEMPER_SCORED; an outcome per result (None: stored)."""
        if not scored:
            return []
        publications = [self._publication(s, d) for s, d in zip(scored, deliveries, strict=True)]
        acks = await self.bus.publish_many(publications, timeout_s=self.settings.publish_timeout_s)
        return [self._outcome(s, ack) for s, ack in zip(scored, acks, strict=True)]

    def _publication(self, scored: ScoredRollout, delivery: Delivery) -> Publication:
        task = scored.rollout.task
        wire = ScoredWire(
            id=scored.id,
            rollout=msgspec.Raw(delivery.msg.data),
            reward=scored.reward,
            status=scored.status,
            details=scored.details,
            error=scored.error,
            validator=scored.validator,
            scored_at=scored.scored_at,
        )
        return Publication(
            subject=subjects.scored(task.domain, task.id),
            payload=self._encoder.encode(wire),
            # Nats-Msg-Id = rollout id: a rollout judged twice is stored once.
            headers=message_headers(trace_id=delivery.trace_id, msg_id=scored.id),
        )

    def _outcome(self, scored: ScoredRollout, ack: PublishResult) -> Outcome:
        if isinstance(ack, PayloadTooLarge):
            # Scoring adds to the rollout; at the size limit it can never be published.
            return Reject(ErrorCode.TOO_LARGE, f"scored rollout: {ack.message}")
        if isinstance(ack, Exception):
            return ack  # not stored (no ack in time, NATS away): handed back, judged again
        self._count(scored, ack)
        return None

    def _count(self, scored: ScoredRollout, ack: StreamAck) -> None:
        if ack.duplicate:
            self.duplicates += 1  # judged before (a redelivery): stored and counted once
            return
        self.published += 1
        task = scored.rollout.task
        domain = self.domains.get(task.domain) if task.domain in self.domains else None
        self.stats.record(task.domain, scored, domain.pass_threshold if domain else None)
