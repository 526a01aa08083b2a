"""A domain's held-out problems and what one evaluation of a policy version measures.

The eval split is decided by a hash of each problem's key (``Domain.split_of``), so it is
disjoint from the train split by construction and the same on every run.  An evaluation
asks for one greedy sample and ``k`` sampled ones per problem and reports greedy
accuracy, sampled accuracy (mean over samples) and pass@k (the unbiased estimator).
An evaluation round measures several domains at once, each on its own line, and their
macro average (each domain counting the same).
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

from protocol.messages import SamplingParams, ScoredRollout, ScoreStatus, Task
from services.domains import Domain, DomainError, Problem
from services.evaluation.intervals import pass_at_k
from services.evaluation.tiers import Outcome, build_report

#: Tier 0, served first: an evaluation measures a version before training moves it on.
EVAL_TIER = 0
#: Draws per held-out problem wanted before the split is taken as exhausted.
_DRAWS = 25


@dataclass(frozen=True, kw_only=True)
class HeldoutSet:
    domain: Domain
    problems: tuple[Problem, ...]
    #: Accuracy of always giving the split's most common answer.
    chance: float

    @classmethod
    def of(cls, domain: Domain, limit: int = 500) -> HeldoutSet:
        """The first ``limit`` distinct eval problems of ``domain`` in draw order (or all
        that ``25 * limit`` draws of the split find), sorted by key.

        Drawing stops at ``limit``: a large split costs ``limit`` draws, not ``25 * limit``,
        and the set is a uniform sample of it rather than its smallest keys."""
        seen: dict[str, Problem] = {}
        wanted = limit * _DRAWS
        for problem in itertools.islice(domain.drawn(wanted, split="eval", seed=0), wanted):
            seen.setdefault(problem.key, problem)
            if len(seen) >= limit:
                break
        if not seen:
            raise DomainError(domain.name, "its eval split is empty: no held-out problems")
        distinct = sorted(seen.values(), key=lambda p: p.key)
        answers = Counter(str(p.metadata.get("answer", p.key)) for p in distinct)
        chance = answers.most_common(1)[0][1] / len(distinct) if distinct else 0.0
        return cls(domain=domain, problems=tuple(distinct), chance=chance)

    def tasks(self, prefix: str, samples: int) -> list[Task]:
        """A greedy task (``<prefix>-<i>-g``) and a ``samples``-sample task (``-s``) each."""
        out: list[Task] = []
        for index, problem in enumerate(self.problems):
            base = self.domain.task(problem, "eval", 0, index)
            greedy = SamplingParams(temperature=0.0, max_tokens=base.sampling.max_tokens)
            out.append(_variant(base, f"{prefix}-{index}-g", 1, greedy))
            if samples:
                out.append(_variant(base, f"{prefix}-{index}-s", samples, base.sampling))
        return out


def _variant(task: Task, task_id: str, n: int, sampling: SamplingParams) -> Task:
    return msgspec.structs.replace(task, id=task_id, n=n, sampling=sampling, tier=EVAL_TIER)


@dataclass(kw_only=True)
class Evaluation:
    """The scored rollouts of one evaluation as they arrive."""

    prefix: str
    heldout: HeldoutSet
    samples: int
    elapsed_s: float
    greedy: dict[int, bool] = field(default_factory=dict)
    sampled: dict[int, list[bool]] = field(default_factory=dict)
    versions: Counter[int] = field(default_factory=Counter)
    failed: int = 0
    #: Every rollout received, for the tiered report (``services.evaluation.tiers``).
    outcomes: list[Outcome] = field(default_factory=list)

    def expected(self) -> int:
        return len(self.heldout.problems) * (1 + self.samples)

    def received(self) -> int:
        return len(self.greedy) + sum(len(v) for v in self.sampled.values()) + self.failed

    def done(self) -> bool:
        return self.received() >= self.expected()

    def add(self, scored: ScoredRollout) -> None:
        task_id = scored.rollout.task.id
        if not task_id.startswith(self.prefix + "-"):
            return
        if scored.rollout.task.domain != self.heldout.domain.name:
            return
        index_text, kind = task_id[len(self.prefix) + 1 :].rsplit("-", 1)
        domain = self.heldout.domain
        outcome = Outcome.of(
            scored,
            family=family_of(domain),
            problem=f"{domain.name}-{index_text}",
            greedy=kind == "g",
            pass_threshold=domain.pass_threshold,
            multi_turn=is_multi_turn(domain),
        )
        self.outcomes.append(outcome)
        if scored.status is not ScoreStatus.SCORED:
            self.failed += 1
            return
        correct = scored.reward >= self.heldout.domain.pass_threshold
        if scored.rollout.policy_version is not None:
            self.versions[scored.rollout.policy_version] += 1
        if kind == "g":
            self.greedy[int(index_text)] = correct
        else:
            self.sampled.setdefault(int(index_text), []).append(correct)

    def result(self) -> dict[str, float | int | str]:
        """The held-out line: accuracy figures, the version measured, the chance level."""
        greedy = list(self.greedy.values())
        flat = [c for v in self.sampled.values() for c in v]
        passes = [
            pass_at_k(len(v), sum(v), min(self.samples, len(v))) for v in self.sampled.values()
        ]
        version = self.versions.most_common(1)[0][0] if self.versions else 0
        return {
            "domain": self.heldout.domain.name,
            "version": version,
            "versions_seen": len(self.versions),
            "elapsed_s": round(self.elapsed_s, 1),
            "greedy_accuracy": _mean(greedy),
            "sampled_accuracy": _mean(flat),
            f"pass_at_{self.samples}": statistics.fmean(passes) if passes else 0.0,
            "problems": len(greedy),
            "samples": self.samples,
            "failed": self.failed,
            "chance": self.heldout.chance,
        }

    def tier_report(self, policy: str) -> dict[str, Any]:
        """The unit, chain and system figures of this evaluation (``report.json``'s schema)."""
        version = self.versions.most_common(1)[0][0] if self.versions else 0
        return build_report(self.outcomes, k=self.samples, policy=policy, version=version)


@dataclass(kw_only=True)
class EvaluationRound:
    """One evaluation of several domains' held-out sets, submitted together."""

    #: The round's number in its run (1, 2, ...), written on each of its lines.
    number: int
    evaluations: tuple[Evaluation, ...]

    def add(self, scored: ScoredRollout) -> None:
        for evaluation in self.evaluations:
            evaluation.add(scored)

    def done(self) -> bool:
        return all(evaluation.done() for evaluation in self.evaluations)

    def version(self) -> int:
        """The policy version most of the round's rollouts came from."""
        versions: Counter[int] = Counter()
        for evaluation in self.evaluations:
            versions.update(evaluation.versions)
        return versions.most_common(1)[0][0] if versions else 0

    def results(self) -> list[dict[str, Any]]:
        """One held-out line per domain."""
        return [{**e.result(), "evaluation": self.number} for e in self.evaluations]

    def tier_report(self, policy: str) -> dict[str, Any]:
        """The unit, chain and system figures of every domain of the round."""
        outcomes = [o for evaluation in self.evaluations for o in evaluation.outcomes]
        samples = self.evaluations[0].samples if self.evaluations else 0
        return build_report(outcomes, k=samples, policy=policy, version=self.version())


#: The ``domain`` of a macro-average line (not a domain name: those have no spaces).
MACRO = "macro average"
#: The figures a macro average takes the unweighted mean of, over domains.
MACRO_KEYS = ("greedy_accuracy", "sampled_accuracy", "chance")


def macro_average(lines: list[dict[str, Any]], version: int) -> dict[str, Any]:
    """The unweighted mean over domains of one round's held-out lines: each domain counts
    the same, however many problems its split has."""
    samples = int(lines[0]["samples"])
    keys = [*MACRO_KEYS, f"pass_at_{samples}"]
    return {
        "domain": MACRO,
        "domains": [line["domain"] for line in lines],
        "evaluation": lines[0].get("evaluation", 0),
        "version": version,
        "elapsed_s": lines[0]["elapsed_s"],
        **{key: statistics.fmean(float(line[key]) for line in lines) for key in keys},
        "problems": sum(int(line["problems"]) for line in lines),
        "samples": samples,
        "failed": sum(int(line["failed"]) for line in lines),
    }


def is_multi_turn(domain: Domain) -> bool:
    return domain.max_turns > 1 or bool(domain.tools)


def family_of(domain: Domain) -> str:
    return domain.kind or domain.name


def _mean(values: list[bool]) -> float:
    return sum(values) / len(values) if values else 0.0
