"""The replay buffer's store: scored rollouts grouped by task, handed out as whole groups.

Pure data structure (no I/O).  Each held rollout carries a release callback; the
service acks its JetStream message when the rollout leaves the buffer (served, stale,
or excluded), so a rollout is never lost between the scored stream and the learner.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from protocol.messages import ScoredRollout, ScoreStatus
from services.domains.api import is_heldout

Release = Callable[[], None]


@dataclass(kw_only=True)
class Group:
    """The samples of one task (a GRPO group) received so far."""

    task_id: str
    domain: str
    size: int
    first_seen: float
    members: dict[str, tuple[ScoredRollout, Release]] = field(default_factory=dict)

    def complete(self) -> bool:
        return len(self.members) >= self.size

    def usable(self) -> list[ScoredRollout]:
        """Members that may enter advantage statistics: scored, not infra failures."""
        return [s for s, _ in self.members.values() if s.status is ScoreStatus.SCORED]


@dataclass(kw_only=True)
class Counts:
    received: int = 0
    duplicates: int = 0
    served: int = 0
    dropped_stale: int = 0
    #: Infra failures and invalid rollouts: acknowledged, never served.
    excluded: int = 0
    #: Rollouts of eval-split tasks: acknowledged, never trained on.
    heldout: int = 0


@dataclass(frozen=True, kw_only=True)
class Selection:
    items: list[ScoredRollout]
    dropped_stale: int
    remaining: int


def staleness(item: ScoredRollout, learner_version: int) -> int:
    version = item.rollout.policy_version
    return 0 if version is None else max(0, learner_version - version)


class ReplayBuffer:
    """Groups in arrival order; selection by domain weights, oldest group first per domain."""

    def __init__(self, *, group_timeout_s: float, remember: int = 100_000, seed: int = 0) -> None:
        self.group_timeout_s = group_timeout_s
        #: Ids of rollouts already served or dropped, so a late redelivery is not served again.
        self.remember = remember
        self._gone: OrderedDict[str, None] = OrderedDict()
        self.counts = Counts()
        self._groups: OrderedDict[str, Group] = OrderedDict()
        self._held: set[str] = set()
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self._held)

    def add(self, item: ScoredRollout, release: Release, now: float | None = None) -> bool:
        """Hold ``item`` until it is served or dropped; False (nothing held) for a duplicate
        or a rollout of a held-out (eval split) task, which is never trained on."""
        self.counts.received += 1
        if is_heldout(item.rollout.task):
            self.counts.heldout += 1
            return False
        if item.id in self._held or item.id in self._gone:
            self.counts.duplicates += 1
            return False
        task = item.rollout.task
        group = self._groups.get(task.id)
        if group is None:
            group = Group(
                task_id=task.id,
                domain=task.domain,
                size=task.n,
                first_seen=time.monotonic() if now is None else now,
            )
            self._groups[task.id] = group
        group.members[item.id] = (item, release)
        self._held.add(item.id)
        return True

    def release_all(self) -> None:
        """Forget everything held (on stop the service hands the messages back instead)."""
        self._groups.clear()
        self._held.clear()

    # ------------------------------------------------------------------ selection

    def take(
        self,
        *,
        learner_version: int,
        max_staleness: int,
        max_samples: int,
        whole_groups: bool,
        domain_weights: Mapping[str, float],
        fits: Callable[[ScoredRollout], bool] = lambda _: True,
        now: float | None = None,
    ) -> Selection:
        now = time.monotonic() if now is None else now
        stale = self._drop_stale(learner_version, max_staleness)
        ready = [g for g in self._groups.values() if self._ready(g, whole_groups, now)]
        chosen: list[ScoredRollout] = []
        for group in self._order(ready, domain_weights):
            room = max_samples - len(chosen)
            usable = group.usable()
            if len(usable) > room and whole_groups:
                continue  # a smaller group further on may still fit
            taken = usable[:room]
            if not all(fits(item) for item in taken):
                break
            chosen.extend(taken)
            self._take(group, {item.id for item in taken})
            if len(chosen) >= max_samples:
                break
        remaining = sum(len(g.usable()) for g in self._groups.values())
        self.counts.served += len(chosen)
        return Selection(items=chosen, dropped_stale=stale, remaining=remaining)

    def available(
        self,
        *,
        learner_version: int,
        max_staleness: int,
        whole_groups: bool,
        now: float | None = None,
    ) -> int:
        """Samples that ``take`` could serve now (fresh, usable, in ready groups)."""
        now = time.monotonic() if now is None else now
        return sum(
            sum(1 for s in g.usable() if staleness(s, learner_version) <= max_staleness)
            for g in self._groups.values()
            if self._ready(g, whole_groups, now)
        )

    def _ready(self, group: Group, whole_groups: bool, now: float) -> bool:
        if not whole_groups or group.complete():
            return True
        # A member lost for good (dead-lettered) must not hold its group back forever.
        return now - group.first_seen >= self.group_timeout_s

    def _order(self, ready: list[Group], weights: Mapping[str, float]) -> list[Group]:
        """Oldest first within a domain; domains interleaved by weight (weighted sampling)."""
        by_domain: dict[str, list[Group]] = {}
        for group in ready:
            by_domain.setdefault(group.domain, []).append(group)
        ordered: list[Group] = []
        while by_domain:
            names = sorted(by_domain)
            shares = [weights.get(n, 1.0) if weights else len(by_domain[n]) for n in names]
            if not any(shares):
                break
            name = self._rng.choices(names, weights=shares)[0]
            ordered.append(by_domain[name].pop(0))
            if not by_domain[name]:
                del by_domain[name]
        return ordered

    def _drop_stale(self, learner_version: int, max_staleness: int) -> int:
        dropped = 0
        for group in list(self._groups.values()):
            for rollout_id, (item, release) in list(group.members.items()):
                if staleness(item, learner_version) > max_staleness:
                    del group.members[rollout_id]
                    self._forget(rollout_id)
                    release()
                    dropped += 1
            if not group.members:
                del self._groups[group.task_id]
        self.counts.dropped_stale += dropped
        return dropped

    def _take(self, group: Group, served: set[str]) -> None:
        """Release the served members; a group with no usable member left goes entirely."""
        for rollout_id in served:
            _, release = group.members.pop(rollout_id)
            self._forget(rollout_id)
            release()
        if not group.usable():
            self._drop_group(group)

    def _drop_group(self, group: Group) -> None:
        """Members that never enter training (infra failures, invalid) leave with their group."""
        for rollout_id, (_, release) in group.members.items():
            self._forget(rollout_id)
            self.counts.excluded += 1
            release()
        self._groups.pop(group.task_id, None)

    def _forget(self, rollout_id: str) -> None:
        self._held.discard(rollout_id)
        self._gone[rollout_id] = None
        while len(self._gone) > self.remember:
            self._gone.popitem(last=False)

    def statistics(self) -> dict[str, float]:
        complete = sum(1 for g in self._groups.values() if g.complete())
        return {
            "held": float(len(self._held)),
            "groups": float(len(self._groups)),
            "complete_groups": float(complete),
            "received": float(self.counts.received),
            "duplicates": float(self.counts.duplicates),
            "served": float(self.counts.served),
            "dropped_stale": float(self.counts.dropped_stale),
            "excluded": float(self.counts.excluded),
            "heldout": float(self.counts.heldout),
        }
