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
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.errors import ErrorCode, PayloadTooLarge
from protocol.messages import Rollout, ScoredRollout
from services.domains import DomainRegistry, load_registry
from services.runtime import ConsumerSpec, ConsumerTuning, Delivery, Reject, Service
from services.validator.compose import Scorer
from services.validator.factory import Resources, RewardModels
from services.validator.sandbox import NatsSandbox
from services.validator.settings import ValidatorSettings
from services.validator.stats import DomainStats


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
        self.consume(self._consumer_spec(), Codec(Rollout), self._on_rollout, self._tuning())

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
            max_in_flight=self.settings.max_in_flight, fetch_wait_s=self.settings.fetch_wait_s
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

    async def _on_rollout(self, rollout: Rollout, delivery: Delivery) -> None:
        scored = await self.scorer.score(rollout)
        await self._publish(scored, delivery.trace_id)

    async def _publish(self, scored: ScoredRollout, trace_id: str) -> None:
        task = scored.rollout.task
        try:
            ack = await self.bus.publish(
                subjects.scored(task.domain, task.id),
                scored,
                trace_id=trace_id,
                msg_id=scored.id,
                timeout_s=self.settings.publish_timeout_s,
            )
        except PayloadTooLarge as error:
            # Scoring adds to the rollout; at the size limit it can never be published.
            raise Reject(ErrorCode.TOO_LARGE, f"scored rollout: {error.message}") from None
        if ack.duplicate:
            self.duplicates += 1  # judged before (a redelivery): stored and counted once
            return
        self.published += 1
        domain = self.domains.get(task.domain) if task.domain in self.domains else None
        self.stats.record(task.domain, scored, domain.pass_threshold if domain else None)
