"""``temper train``'s feeder: keeps tasks of the run's domain mix outstanding.

Each top-up draws the domains of the missing tasks by weight (``draw_domains``, seeded, so
the same open counts give the same draw), skipping a domain that already holds its bound
of tasks in flight: a slow domain (sandboxed tests, long answers) then cannot fill every
slot while the others wait.  A task is done once its whole group is scored.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from protocol import subjects
from protocol.codec import encode
from protocol.messages import Task
from services.domains import Domain
from services.feeder.mix import domain_bounds, draw_domains

#: A task not done after this long (a sample dead-lettered) stops counting as in flight.
GIVE_UP_S = 300.0


@dataclass(frozen=True, kw_only=True)
class FeedPlan:
    mix: tuple[tuple[Domain, float], ...]
    in_flight: int
    #: Samples per task (the GRPO group), whatever the domain's own default.
    group: int
    seed: int


class Feeder:
    """Keeps ``in_flight`` tasks of the mix outstanding; a task is done once scored."""

    def __init__(self, nc: NATS, plan: FeedPlan) -> None:
        self._nc = nc
        self._plan = plan
        self._domains = {domain.name: domain for domain, _ in plan.mix}
        self._weights = {domain.name: weight for domain, weight in plan.mix}
        self._bounds = domain_bounds(plan.in_flight, self._weights)
        self._rng = random.Random(plan.seed)
        self._scored: Counter[str] = Counter()
        #: Task id -> (domain, when it was submitted); forgotten once done or given up.
        self._open: dict[str, tuple[str, float]] = {}
        self._round = 0
        #: Tasks published per domain since the start.
        self.drawn: Counter[str] = Counter()
        #: Tasks whose whole group was scored, per domain.
        self.done: Counter[str] = Counter()

    async def start(self) -> None:
        await self._nc.subscribe(subjects.scored_all(), cb=self._on_scored)

    def in_flight(self) -> Counter[str]:
        return Counter(domain for domain, _ in self._open.values())

    async def _on_scored(self, msg: Msg) -> None:
        # The task id is the subject's last token: no need to decode the whole rollout.
        task_id = msg.subject.rsplit(".", 1)[-1]
        if task_id not in self._open:
            return
        self._scored[task_id] += 1
        if self._scored[task_id] >= self._plan.group:
            domain, _ = self._open.pop(task_id)
            del self._scored[task_id]
            self.done[domain] += 1

    async def top_up(self) -> None:
        self._forget_stuck()
        missing = self._plan.in_flight - len(self._open)
        if missing <= 0:
            return
        js = self._nc.jetstream()
        for task in self._tasks(missing):
            await js.publish(subjects.of_task(task), encode(task), headers={"Nats-Msg-Id": task.id})
            self._open[task.id] = (task.domain, time.monotonic())
            self.drawn[task.domain] += 1

    def _forget_stuck(self) -> None:
        # A task that never completes (a sample dead-lettered) must not stall the feed.
        now = time.monotonic()
        for task_id, (_, sent) in list(self._open.items()):
            if now - sent > GIVE_UP_S:
                del self._open[task_id]
                self._scored.pop(task_id, None)

    def _tasks(self, count: int) -> Iterator[Task]:
        names = draw_domains(count, self._weights, self.in_flight(), self._bounds, self._rng)
        self._round += 1
        # Task ids carry the seed: one from the clock keeps them unique across runs.
        seed = int(time.time()) * 1000 + self._round
        for name, wanted in Counter(names).items():
            for task in self._domains[name].make_tasks(wanted, split="train", seed=seed):
                yield _with_group(task, self._plan.group)

    def statistics(self) -> list[str]:
        """One line per domain: drawn, done and in flight."""
        flying = self.in_flight()
        return [
            f"{name}: {self.drawn[name]} tasks drawn, {self.done[name]} done, "
            f"{flying[name]} in flight (at most {self._bounds[name]})"
            for name in self._weights
        ]


def _with_group(task: Task, group: int) -> Task:
    fields = {f: getattr(task, f) for f in task.__struct_fields__ if f != "v"}
    fields["n"] = group
    return Task(**fields)
