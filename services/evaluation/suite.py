"""An evaluation over several domains: their eval splits as eval-tier tasks, the scored
rollouts reduced to outcomes as they arrive, and the tiered report once all are in.

Task ids are ``<run>-<domain>-<problem>-g`` (one greedy sample) and ``...-s`` (``samples``
sampled ones), so a scored rollout names its problem and kind without a lookup table.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from protocol.messages import ScoredRollout, Task
from services.domains import Domain
from services.evaluation.heldout import HeldoutSet, family_of, is_multi_turn
from services.evaluation.tiers import Outcome, build_report


@dataclass(frozen=True, kw_only=True)
class SuitePlan:
    domains: tuple[Domain, ...]
    #: Sampled answers per problem besides the greedy one (pass@k's ``k``).
    samples: int
    #: Held-out problems per domain, at most.
    limit: int


@dataclass(kw_only=True)
class EvalSuite:
    """The eval tasks of ``plan`` under ``run`` and the outcomes received for them."""

    run: str
    plan: SuitePlan
    sets: dict[str, HeldoutSet] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    versions: Counter[int] = field(default_factory=Counter)
    _seen: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        for domain in self.plan.domains:
            self.sets[domain.name] = HeldoutSet.of(domain, limit=self.plan.limit)

    def tasks(self) -> list[Task]:
        """Every task of the suite, stamped now: latency runs from submission to scoring."""
        out: list[Task] = []
        for name, heldout in self.sets.items():
            out.extend(heldout.tasks(f"{self.run}-{name}", self.plan.samples))
        now = time.time()
        return [msgspec.structs.replace(task, created_at=now) for task in out]

    def expected(self) -> int:
        per_problem = 1 + self.plan.samples
        return sum(len(h.problems) * per_problem for h in self.sets.values())

    def done(self) -> bool:
        return len(self._seen) >= self.expected()

    def add(self, scored: ScoredRollout) -> bool:
        """Keep ``scored`` when it belongs to this suite (once); whether it did."""
        task_id = scored.rollout.task.id
        if scored.id in self._seen or not task_id.startswith(self.run + "-"):
            return False
        heldout = self.sets.get(scored.rollout.task.domain)
        if heldout is None:
            return False
        problem, kind = task_id.rsplit("-", 1)
        domain = heldout.domain
        self._seen.add(scored.id)
        if scored.rollout.policy_version is not None:
            self.versions[scored.rollout.policy_version] += 1
        self.outcomes.append(
            Outcome.of(
                scored,
                family=family_of(domain),
                problem=problem,
                greedy=kind == "g",
                pass_threshold=domain.pass_threshold,
                multi_turn=is_multi_turn(domain),
            )
        )
        return True

    def version(self) -> int | None:
        """The policy version most rollouts came from (``None`` before any arrived)."""
        return self.versions.most_common(1)[0][0] if self.versions else None

    def report(self, policy: str, version: int | None = None, worst: int = 5) -> dict[str, Any]:
        """The tiered report; ``version`` names the policy where the rollouts cannot (a
        published version loaded as a model directory is version 0 to its generator)."""
        served = self.version() if version is None else version
        report = build_report(
            self.outcomes, k=self.plan.samples, policy=policy, version=served, worst=worst
        )
        report["expected_rollouts"] = self.expected()
        report["received_rollouts"] = len(self._seen)
        return report


def domains_needing_sandbox(domains: Sequence[Domain]) -> list[str]:
    """Domains whose tool calls or validators run code in the sandbox service."""
    return [d.name for d in domains if d.tools or d.sandbox is not None]


#: (tier, figure) pairs of a domain's report that become TensorBoard scalars.
_SCALARS = (
    ("unit", "greedy"),
    ("unit", "pass_at_1"),
    ("unit", "pass_at_k"),
    ("system", "success_rate"),
    ("system", "infra_failure_rate"),
    ("chain", "completion_rate"),
    ("chain", "recovery_rate"),
)


def tier_scalars(report: dict[str, Any]) -> dict[str, float]:
    """Headline figures per domain, flat (``<domain>/<tier>_<figure>``), for TensorBoard."""
    out: dict[str, float] = {}
    for name, domain in report["domains"].items():
        for tier, figure in _SCALARS:
            value = (domain.get(tier) or {}).get(figure)
            if isinstance(value, dict):
                out[f"{name}/{tier}_{figure}"] = float(value["value"])
        latency = domain["system"]["latency_s"]
        if "p95" in latency:
            out[f"{name}/system_latency_p95_s"] = float(latency["p95"])
    return out
