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

import gc
import time
from collections.abc import Coroutine
from typing import Any

import msgspec
from prometheus_client import Counter

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.errors import ErrorCode, PayloadTooLarge
from protocol.messages import (
    DomainList,
    DomainsRequest,
    Message,
    Rollout,
    ScoreStatus,
    ValidatorDetail,
)
from services.domains import DomainRegistry, load_registry
from services.runtime import (
    ConsumerSpec,
    ConsumerTuning,
    Delivery,
    Outcome,
    Publication,
    PublishResult,
    Reject,
    Request,
    Result,
    Service,
    StreamAck,
)
from services.runtime.bus import message_headers
from services.runtime.deadletter import Rejection
from services.runtime.stages import Stages
from services.validator.catalog import Catalog
from services.validator.compose import Judgement, Scorer
from services.validator.factory import Resources, RewardModels
from services.validator.sandbox import NatsSandbox
from services.validator.sessions import NatsSessions
from services.validator.settings import ValidatorSettings, preview_mode
from services.validator.stats import DomainStats

#: Batches per instance in flight at once: one is judged while others wait for their acks.
BATCHES_IN_FLIGHT = 4


def tune_gc(young_threshold: int) -> None:
    """Collect less often, and never walk what was loaded before serving.

    A decoded rollout is a dozen containers that stay alive until its batch is settled,
    so at Python's default (700) each young collection walks the batches in flight (some
    10,000 containers at ``max_in_flight`` 1024, a few ms) and moves them on to be walked
    again by the next generation.  Garbage cycles are rare on this path (rollouts are
    freed by reference counting), so little waits for a rarer collection.  What is loaded
    by then (modules, domains, validators) lives as long as the process; frozen, the full
    collections that rollouts in flight set off leave it alone.
    """
    if young_threshold <= 0:
        return
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if 0 < young < young_threshold:  # 0: collection switched off on purpose
        gc.set_threshold(young_threshold, middle, old)


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
        #: Scores a validator gave outside its declared range (clamped): a bug to find.
        self.clamped = 0
        self._clamped = Counter(
            "temper_validator_clamped",
            "Scores outside their validator's declared range, clamped into it",
            ["domain", "validator"],
            registry=self.metrics.registry,
        )
        self.published = 0
        self.duplicates = 0
        #: Per fetch of rollouts: judging them and storing the results.
        self.stages = Stages()
        self._waits: set[str] = set()
        #: Pass threshold by domain name (a dict lookup: this runs for every result).
        self._thresholds: dict[str, float] = {}
        self._encoder = msgspec.msgpack.Encoder()
        self._catalog: Catalog | None = None

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
            sessions=NatsSessions(
                self.bus.nc, self.settings.sandbox_timeout_s + self.settings.sandbox_grace_s
            ),
            reward_models=self._reward_models,
            sandbox_timeout_s=self.settings.sandbox_timeout_s,
            sandbox_grace_s=self.settings.sandbox_grace_s,
            cad_previews=preview_mode(self.settings.cad_previews),
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
        self._waits = {name for name in self.scorer.panels if not self.scorer.inline(name)}
        self._thresholds = {domain.name: domain.pass_threshold for domain in self.domains}
        self.consume_batch(self._consumer_spec(), Codec(Rollout), self._on_rollouts, self._tuning())
        self._catalog = Catalog(self.domains, validator=self.scorer.validator)
        self.respond(subjects.domains(), Codec(DomainsRequest), self._on_domains)
        tune_gc(self.settings.young_gc_threshold)

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

    async def _on_domains(self, request: DomainsRequest, _: Request) -> DomainList:
        """Every served domain (or those named): what a client needs to build valid tasks."""
        if self._catalog is None:
            raise RuntimeError("the domains are loaded at start")
        return await self._catalog.answer(request, self.bus.nc.max_payload)

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
        values["clamped"] = float(self.clamped)
        values.update(self.stages.figures())
        batchers = self._reward_models.batchers.values()
        batches, scored = sum(b.batches for b in batchers), sum(b.scored for b in batchers)
        if batches:
            values["reward_model_batches"] = float(batches)
            values["reward_model_scored"] = float(scored)
            values["reward_model_mean_batch"] = scored / batches
        return values

    async def _on_rollouts(self, batch: list[tuple[Rollout, Delivery]]) -> list[Result]:
        with self.stages.stage("validate"):
            return await self._judge_fetch(batch)

    async def _judge_fetch(self, batch: list[tuple[Rollout, Delivery]]) -> list[Result]:
        """Judge a fetch: rule domains inline, then all their results in one publish_many."""
        results: list[Result] = [None] * len(batch)
        inline: list[tuple[Rollout, Delivery]] = []
        judged: list[Judgement] = []
        placed: list[int] = []
        alone: list[int] = []
        for index, (rollout, delivery) in enumerate(batch):
            if rollout.task.domain in self._waits:
                alone.append(index)
                continue
            try:
                judged.append(self.scorer.judge_now(rollout))
            except Exception as error:  # a scorer bug fails this rollout, not the batch
                results[index] = error
                continue
            inline.append((rollout, delivery))
            placed.append(index)
        outcomes = await self._publish(inline, judged)
        for index, outcome in zip(placed, outcomes, strict=True):
            results[index] = outcome
        # Made last, so that nothing above can raise and leave them never awaited.
        for index in alone:
            results[index] = self._judge_alone(*batch[index])
        return results

    async def _judge_alone(self, rollout: Rollout, delivery: Delivery) -> Outcome:
        judgement = await self.scorer.judge(rollout)
        [outcome] = await self._publish([(rollout, delivery)], [judgement])
        return outcome

    async def _publish(
        self, items: list[tuple[Rollout, Delivery]], judged: list[Judgement]
    ) -> list[Outcome]:
        """Store every result in TEMPER_SCORED; an outcome per result (None: stored)."""
        if not items:
            return []
        publications = [self._publication(*item, j) for item, j in zip(items, judged, strict=True)]
        acks = await self.bus.publish_many(publications, timeout_s=self.settings.publish_timeout_s)
        for (rollout, delivery), judgement, ack in zip(items, judged, acks, strict=True):
            stored = not isinstance(ack, Exception) and not ack.duplicate
            if stored and judgement.clamped():
                await self._flag_clamped(rollout, delivery, judgement)
        return [
            self._outcome(rollout.task.domain, judgement, ack)
            for (rollout, _), judgement, ack in zip(items, judged, acks, strict=True)
        ]

    async def _flag_clamped(
        self, rollout: Rollout, delivery: Delivery, judgement: Judgement
    ) -> None:
        """A score outside its validator's range: counted, and an error event names the
        rollout (the stored result holds the clamped score and the score as given)."""
        for detail in judgement.clamped():
            self.clamped += 1
            self._clamped.labels(domain=rollout.task.domain, validator=detail.name).inc()
            index = judgement.details.index(detail)
            rejection = Rejection(
                code=ErrorCode.VALIDATION,
                message=f"rollout {rollout.id}: validator {detail.name!r} scored "
                f"{detail.clamped_from:g}, outside its declared range; clamped to {detail.score:g}",
                field=f"$.details[{index}].score",
                source=self.name,
                subject=subjects.scored(rollout.task.domain, rollout.task.id),
                key=f"clamped:{rollout.id}:{index}",
            )
            self.log.error("score_clamped", rollout=rollout.id, validator=detail.name)
            # The rollout as received, so the case can be judged again by hand.
            await self.dead_letters.event(rejection, delivery.msg.data, delivery.trace_id)

    def _publication(
        self, rollout: Rollout, delivery: Delivery, judgement: Judgement
    ) -> Publication:
        wire = ScoredWire(
            id=rollout.id,
            rollout=msgspec.Raw(delivery.msg.data),
            reward=judgement.reward,
            status=judgement.status,
            details=judgement.details,
            error=judgement.error,
            validator=self.scorer.validator,
            scored_at=time.time(),
        )
        return Publication(
            subject=subjects.scored(rollout.task.domain, rollout.task.id),
            payload=self._encoder.encode(wire),
            # Nats-Msg-Id = rollout id: a rollout judged twice is stored once.
            headers=message_headers(trace_id=delivery.trace_id, msg_id=rollout.id),
        )

    def _outcome(self, domain: str, judgement: Judgement, ack: PublishResult) -> Outcome:
        if isinstance(ack, PayloadTooLarge):
            # Scoring adds to the rollout; at the size limit it can never be published.
            return Reject(ErrorCode.TOO_LARGE, f"scored rollout: {ack.message}")
        if isinstance(ack, Exception):
            return ack  # not stored (no ack in time, NATS away): handed back, judged again
        self._count(domain, judgement, ack)
        return None

    def _count(self, domain: str, judgement: Judgement, ack: StreamAck) -> None:
        if ack.duplicate:
            self.duplicates += 1  # judged before (a redelivery): stored and counted once
            return
        self.published += 1
        self.stats.record(domain, judgement.status, judgement.reward, self._thresholds.get(domain))
