"""The replay buffer's store: scored rollouts grouped by task, handed out as whole groups.

Pure data structure (no I/O).  Each held rollout carries a release callback; the
service acks its JetStream message when the rollout leaves the buffer (served, stale,
or excluded), so a rollout is never lost between the scored stream and the learner.

A rollout served under a lease leaves the groups but keeps its callback: it is acked
only by ``commit`` (the learner's step that used it is durable), and ``release_leases``
puts it back when the learner that held it restarted without committing.
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
    #: Served once and handed back by a lease release: ready whatever its size, since
    #: members that never enter training left it when it was first served.
    returned: bool = False

    def complete(self) -> bool:
        return self.returned or len(self.members) >= self.size

    def has_sample(self, index: int) -> bool:
        return any(s.rollout.sample_index == index for s, _ in self.members.values())

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
    #: Leased rollouts acked by a commit, and handed back by a lease release.
    committed: int = 0
    released: int = 0


@dataclass(frozen=True, kw_only=True)
class Selection:
    items: list[ScoredRollout]
    dropped_stale: int
    #: Members that left untrained with their group (infra failures, invalid).
    excluded: int
    remaining: int


def staleness(item: ScoredRollout, learner_version: int) -> int:
    """Versions the learner is ahead of the rollout's oldest segment.  Never clamped: a
    negative value (a rollout newer than the learner) is served, and the learner refuses
    it loudly, instead of hiding a lineage error."""
    version = item.rollout.policy_version
    return 0 if version is None else learner_version - version


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
        #: Served under a lease, waiting for the learner's commit.
        self._leased: dict[str, tuple[ScoredRollout, Release]] = {}
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
        if item.id in self._held or item.id in self._leased or item.id in self._gone:
            self.counts.duplicates += 1
            return False
        if self._sample_held(item):
            self.counts.duplicates += 1
            return False
        self._insert(item, release, time.monotonic() if now is None else now)
        return True

    def _sample_held(self, item: ScoredRollout) -> bool:
        """The group holds this sample already, from another attempt (a redelivered task
        whose samples failed differently the second time)."""
        group = self._groups.get(item.rollout.task.id)
        return group is not None and group.has_sample(item.rollout.sample_index)

    def _insert(self, item: ScoredRollout, release: Release, now: float) -> Group:
        task = item.rollout.task
        group = self._groups.get(task.id)
        if group is None:
            group = Group(task_id=task.id, domain=task.domain, size=task.n, first_seen=now)
            self._groups[task.id] = group
        group.members[item.id] = (item, release)
        self._held.add(item.id)
        return group

    def release_all(self) -> None:
        """Forget everything held (on stop the service hands the messages back instead)."""
        self._groups.clear()
        self._held.clear()
        self._leased.clear()

    # ------------------------------------------------------------------ leases

    def commit(self, rollout_ids: list[str]) -> tuple[int, int]:
        """Ack ``rollout_ids`` for good: (committed, unknown).

        An id still waiting in a group (redelivered after a restart of this service, and
        trained already by the learner) is taken out and acked too: it must not be
        served again.
        """
        committed = 0
        for rollout_id in rollout_ids:
            entry = self._leased.pop(rollout_id, None) or self._pop_held(rollout_id)
            if entry is None:
                continue
            committed += 1
            entry[1]()
        self.counts.committed += committed
        return committed, len(rollout_ids) - committed

    def _pop_held(self, rollout_id: str) -> tuple[ScoredRollout, Release] | None:
        if rollout_id not in self._held:
            return None
        for group in self._groups.values():
            entry = group.members.pop(rollout_id, None)
            if entry is None:
                continue
            self._forget(rollout_id)
            if not group.members:
                del self._groups[group.task_id]
            return entry
        return None

    def release_leases(self, now: float | None = None) -> int:
        """Put every leased rollout back, ready to be served again (whole groups as they were)."""
        now = time.monotonic() if now is None else now
        leased, self._leased = self._leased, {}
        for rollout_id, (item, release) in leased.items():
            self._gone.pop(rollout_id, None)
            self._insert(item, release, now).returned = True
        self.counts.released += len(leased)
        return len(leased)

    @property
    def leased(self) -> int:
        return len(self._leased)

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
        lease: bool = False,
    ) -> Selection:
        now = time.monotonic() if now is None else now
        stale = self._drop_stale(learner_version, max_staleness)
        excluded_before = self.counts.excluded
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
            self._take(group, {item.id for item in taken}, lease)
            if len(chosen) >= max_samples:
                break
        remaining = sum(len(g.usable()) for g in self._groups.values())
        self.counts.served += len(chosen)
        return Selection(
            items=chosen,
            dropped_stale=stale,
            excluded=self.counts.excluded - excluded_before,
            remaining=remaining,
        )

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

    def _take(self, group: Group, served: set[str], lease: bool) -> None:
        """Release (or lease) the served members; a group with no usable member left goes
        entirely."""
        for rollout_id in served:
            entry = group.members.pop(rollout_id)
            self._forget(rollout_id)
            if lease:
                self._leased[rollout_id] = entry
            else:
                entry[1]()
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
            "leased": float(len(self._leased)),
            "committed": float(self.counts.committed),
            "released": float(self.counts.released),
            "groups": float(len(self._groups)),
            "complete_groups": float(complete),
            "received": float(self.counts.received),
            "duplicates": float(self.counts.duplicates),
            "served": float(self.counts.served),
            "dropped_stale": float(self.counts.dropped_stale),
            "excluded": float(self.counts.excluded),
            "heldout": float(self.counts.heldout),
        }
