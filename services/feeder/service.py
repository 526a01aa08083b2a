"""Feeder service: keeps tasks of a domain mix outstanding for the generators.

Each top-up draws the domains of the missing tasks by weight (each within its in-flight
bound) and walks each domain's dataset with a durable cursor.  A task is published under
an id made of the run, the epoch and the place in it, with that id as ``Nats-Msg-Id``,
and the cursor moves (and is saved) only once the stream has it.  A feeder killed between
the two publishes the same id again on restart and the stream's duplicate window drops
it: no problem of an epoch is skipped or published twice.

The scored stream tells it when a task's whole group is in: the task stops counting as in
flight, its pass rate moves the problem between pools, and a group scored all alike is
counted as filtered (and, by ``filter``, left out).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any

import msgspec

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.messages import ScoredRollout, ScoreStatus, Task
from services.domains import Domain, load_registry
from services.domains.api import task_id
from services.feeder.dataset import Dataset, Visit, moved, pool_sizes
from services.feeder.mix import domain_bounds, draw_domains, parse_mix
from services.feeder.settings import FeederSettings
from services.feeder.state import DomainState, FeederState, OpenTask, StateStore
from services.runtime.consumer import ConsumerTuning, Delivery
from services.runtime.domain_figures import key as figures_key
from services.runtime.jetstream import ConsumerSpec
from services.runtime.service import Service
from services.runtime.settings import SettingsError

DURABLE = "feeder"


class FeederService(Service):
    name = "feeder"

    def __init__(self, settings: FeederSettings) -> None:
        super().__init__(settings.runtime)
        self.settings = settings
        self.weights = parse_mix(settings.mix)
        if not self.weights:
            raise SettingsError("the feeder has no mix: set TEMPER_FEEDER_MIX=name=weight,...")
        if settings.in_flight < 1:
            raise SettingsError(f"feeder in_flight must be at least 1, not {settings.in_flight}")
        self.store = StateStore(settings.state_dir)
        self.progress = FeederState()
        self._saving = asyncio.Lock()
        #: Changes made, and changes the file holds, counted by ``_save``.
        self._changes = self._written = 0
        self.datasets: dict[str, Dataset] = {}
        #: Domain -> why it is out of the mix (its generator raised).
        self.quarantined: dict[str, str] = {}
        self._rng = random.Random(settings.seed)

    async def setup(self) -> None:
        self.progress = await asyncio.to_thread(self.store.load)
        registry = await asyncio.to_thread(load_registry, self.settings.domains_config)
        for name in self.weights:
            # An unknown name is a configuration error: stop before anything is published.
            domain = registry.get(name)
            try:
                self.datasets[name] = await asyncio.to_thread(self._dataset, domain)
            except Exception as error:
                self._quarantine(name, error)
        spec = ConsumerSpec(
            stream=streams.SCORED.name,
            durable=DURABLE,
            new_only=True,
            ack_wait_s=self.settings.ack_wait_s,
            max_deliver=1000,
        )
        tuning = ConsumerTuning(fetch_wait_s=0.5, max_in_flight=256)
        self.consume_batch(spec, Codec(ScoredRollout), self._on_scored, tuning)

    def _dataset(self, domain: Domain) -> Dataset:
        dataset = Dataset.of(domain, self.settings.dataset_size, self.settings.seed)
        if not dataset.problems:
            raise ValueError("no training problems")
        return dataset

    def _quarantine(self, name: str, error: Exception) -> None:
        self.quarantined[name] = f"{type(error).__name__}: {error}"
        self.datasets.pop(name, None)
        self.log.error("domain_quarantined", domain=name, error=self.quarantined[name])

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [self._feed()]

    async def _feed(self) -> None:
        while True:
            await self.top_up()
            await asyncio.sleep(self.settings.top_up_s)

    # ------------------------------------------------------------------ publishing

    async def top_up(self) -> None:
        self._forget_stuck()
        missing = self.settings.in_flight - len(self.progress.open)
        if missing <= 0:
            return
        # A quarantined domain's share goes to the others.
        weights = {n: w for n, w in self.weights.items() if n in self.datasets}
        bounds = domain_bounds(self.settings.in_flight, weights)
        for name in draw_domains(missing, weights, self.open_by_domain(), bounds, self._rng):
            await self._publish_next(name)

    async def _publish_next(self, name: str) -> None:
        dataset = self.datasets.get(name)
        if dataset is None:
            return
        domain_state = self.progress.domain(name)
        visit = dataset.next(domain_state, self.settings)
        try:
            task = self._task(dataset.domain, visit)
        except Exception as error:
            self._quarantine(name, error)
            return
        if task is not None:
            await self.bus.publish(subjects.of_task(task), task, msg_id=task.id)
        self._moved(domain_state, visit, task)
        await self._save()

    def _task(self, domain: Domain, visit: Visit) -> Task | None:
        if visit.problem is None:
            return None
        task = domain.task(visit.problem, "train", self.settings.seed, visit.at.index)
        at = visit.at
        return msgspec.structs.replace(
            task,
            id=task_id(domain.name, self.progress.run, f"e{at.epoch}", at.index),
            n=self.settings.group or task.n,
        )

    def _moved(self, domain_state: DomainState, visit: Visit, task: Task | None) -> None:
        moved(domain_state, visit)
        if task is not None and visit.problem is not None:
            self.progress.open[task.id] = OpenTask(
                domain=task.domain, key=visit.problem.key, group=task.n, sent_at=time.time()
            )

    async def _save(self) -> None:
        """Returns once the file holds every change made before the call.  Calls that queue
        behind a write find theirs written by the next one: one write serves them all."""
        self._changes += 1
        wanted = self._changes
        async with self._saving:
            if self._written >= wanted:
                return
            # Encoded here, where nothing changes it meanwhile; written off the loop.
            covered, encoded = self._changes, msgspec.json.encode(self.progress)
            await asyncio.to_thread(self.store.write, encoded)
            self._written = covered

    def _forget_stuck(self) -> None:
        # A task that never completes (a sample dead-lettered) must not stall the feed.
        cutoff = time.time() - self.settings.give_up_s
        for open_id, task in list(self.progress.open.items()):
            if task.sent_at < cutoff:
                del self.progress.open[open_id]
                self.log.warning("task_given_up", task=open_id, scored=len(task.rewards))

    # ------------------------------------------------------------------ scored groups

    async def _on_scored(self, batch: list[tuple[ScoredRollout, Delivery]]) -> list[None]:
        """Records each sample, and each group once whole; one save for the whole fetch,
        before the runtime acks any of it."""
        for item, _ in batch:
            self._record(item)
        await self._save()
        return [None] * len(batch)

    def _record(self, item: ScoredRollout) -> None:
        task = self.progress.open.get(item.rollout.task.id)
        if task is None:
            return
        scored = item.status is ScoreStatus.SCORED
        task.rewards[item.rollout.id] = item.reward if scored else None
        if len(task.rewards) >= task.group:
            self._group_done(item.rollout.task.id, task)

    def _group_done(self, task_id: str, task: OpenTask) -> None:
        del self.progress.open[task_id]
        domain_state = self.progress.domain(task.domain)
        domain_state.done += 1
        rewards = [r for r in task.rewards.values() if r is not None]
        if not rewards or task.domain not in self.datasets:
            return
        threshold = self.datasets[task.domain].domain.pass_threshold
        domain_state.pass_rate[task.key] = sum(r >= threshold for r in rewards) / len(rewards)
        if len(rewards) > 1 and len(set(rewards)) == 1:
            domain_state.filtered += 1
            self._filter(domain_state, task.key)

    def _filter(self, domain_state: DomainState, key: str) -> None:
        if self.settings.filter == "skip" and key not in domain_state.skipped:
            domain_state.skipped.append(key)
        elif self.settings.filter == "later":
            domain_state.later[key] = domain_state.cursor.epoch + 2

    # ------------------------------------------------------------------ reporting

    def open_by_domain(self) -> Counter[str]:
        return Counter(task.domain for task in self.progress.open.values())

    def health(self) -> tuple[bool, str]:
        """``temper status`` shows the detail: per domain what was drawn, what is in flight,
        what was filtered and the pool sizes; quarantined domains first, with their error."""
        ok, detail = super().health()
        if detail:
            return ok, detail
        parts = [f"{n} QUARANTINED ({e})" for n, e in sorted(self.quarantined.items())]
        flying = self.open_by_domain()
        for name, dataset in self.datasets.items():
            state = self.progress.domain(name)
            pools = pool_sizes(dataset, state, self.settings)
            parts.append(
                f"{name}: drawn {state.drawn}, in flight {flying[name]}, "
                f"filtered {state.filtered}, pools {pools['easy']}/{pools['normal']}/"
                f"{pools['hard']}"
            )
        return ok, "; ".join(parts)

    def statistics(self) -> dict[str, float]:
        values = super().statistics()
        flying = self.open_by_domain()
        values["tasks_in_flight"] = float(len(self.progress.open))
        values["quarantined"] = float(len(self.quarantined))
        for name, dataset in self.datasets.items():
            values.update(self._domain_figures(name, dataset, flying[name]))
        return values

    def _domain_figures(self, name: str, dataset: Dataset, flying: int) -> dict[str, float]:
        state = self.progress.domain(name)
        figures = {
            "drawn": state.drawn,
            "done": state.done,
            "in_flight": flying,
            "filtered": state.filtered,
            "passed_over": sum(state.passed_over.values()),
            "epoch": state.cursor.epoch,
            "dataset": len(dataset.problems),
        }
        for pool, size in pool_sizes(dataset, state, self.settings).items():
            figures[f"pool_{pool}"] = size
        return {figures_key(name, figure): float(value) for figure, value in figures.items()}
