"""What an evaluation measures, in three tiers, per domain and pooled (``report.json``).

* unit: one answer at a time: greedy accuracy, pass@1, pass@k, well-formed tool calls,
  the pass rate of code domains.
* chain: whole multi-turn trajectories: reaching a final answer, turns and tool calls
  taken, recovering from a failed tool call.
* system: what running it costs: success and failure rates, latency, tokens and seconds.

Accuracy figures leave infrastructure failures out: a rollout the stack failed to
produce or judge says nothing about the policy.  The system tier counts them apart.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Final

from protocol.messages import FinishReason, RolloutStatus, ScoredRollout, ScoreStatus
from protocol.packed import I32
from services.evaluation.intervals import (
    Interval,
    bootstrap_mean,
    bootstrap_ratio,
    pass_at_k,
    percentiles,
    wilson,
)
from services.evaluation.previews import domain_previews, shown

SCHEMA: Final = 1
INFRA: Final = ScoreStatus.INFRA_FAILURE.value
INVALID: Final = ScoreStatus.INVALID.value
#: Tool call statuses of a call that never ran: ``invalid`` (no parsable call, see
#: ``services.generator.agent``) and ``error`` (unknown tool, bad arguments).  Sandbox
#: statuses such as ``nonzero_exit`` are well-formed calls whose code failed.
FORMAT_ERRORS: Final = frozenset({"invalid", "error"})
COST_KEYS: Final = ("prompt_tokens", "completion_tokens", "generator_s", "sandbox_s", "validator_s")
#: The system tier's cost per solved task: figure name, the outcome's cost it sums.
PER_SOLVED: Final = (
    ("tokens_per_solved", "completion_tokens"),
    ("generator_s_per_solved", "generator_s"),
    ("sandbox_s_per_solved", "sandbox_s"),
)
#: Keys of the macro and micro summaries of a family and of the whole report.
SUMMARY_KEYS: Final = ("greedy", "pass_at_1", "pass_at_k", "success_rate", "infra_failure_rate")


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One scored rollout reduced to what evaluation needs."""

    domain: str
    family: str
    #: Stable id of the held-out problem (its task id minus the greedy/sampled suffix).
    problem: str
    greedy: bool
    #: ``scored``, ``invalid`` or ``infra_failure``; an infra-failed rollout counts as the latter.
    status: str
    correct: bool
    reward: float
    multi_turn: bool
    #: The trajectory reached a final answer (not cut by length, max_turns or deadline).
    finished: bool
    turns: int
    tool_calls: int
    #: Tool calls whose status is not ``ok``.
    tool_errors: int
    #: Tool calls that never ran (status in :data:`FORMAT_ERRORS`).
    tool_format_errors: int
    recovered: bool
    latency_s: float | None
    prompt_tokens: int
    completion_tokens: int
    generator_s: float
    sandbox_s: float
    validator_s: float
    validators: dict[str, float]
    #: A validator's picture of the answer (a CAD render), and what that validator said.
    preview: bytes | None = None
    note: str = ""

    @classmethod
    def of(
        cls,
        scored: ScoredRollout,
        *,
        family: str,
        problem: str,
        greedy: bool,
        pass_threshold: float,
        multi_turn: bool,
    ) -> Outcome:
        rollout = scored.rollout
        failed = rollout.status is RolloutStatus.INFRA_FAILURE
        status = INFRA if failed else scored.status.value
        correct = status == ScoreStatus.SCORED.value and scored.reward >= pass_threshold
        tool_errors = sum(c.status != "ok" for c in rollout.tool_calls)
        picture = shown(scored)
        completion = len(rollout.tokens) // I32.itemsize - rollout.prompt_len
        gen_turns = sum(s.kind == "gen" for s in rollout.segments)
        return cls(
            domain=rollout.task.domain,
            family=family,
            problem=problem,
            greedy=greedy,
            status=status,
            correct=correct,
            reward=scored.reward,
            multi_turn=multi_turn,
            finished=rollout.finish_reason is FinishReason.STOP,
            turns=max(gen_turns, 1 if completion else 0),
            tool_calls=len(rollout.tool_calls),
            tool_errors=tool_errors,
            tool_format_errors=sum(c.status in FORMAT_ERRORS for c in rollout.tool_calls),
            recovered=correct and tool_errors > 0,
            latency_s=_elapsed(rollout.task.created_at, scored.scored_at),
            prompt_tokens=rollout.prompt_len,
            completion_tokens=completion,
            generator_s=rollout.timings.generate_s,
            sandbox_s=_sandbox_s(scored),
            validator_s=_elapsed(rollout.created_at, scored.scored_at) or 0.0,
            validators={d.name: d.score for d in scored.details if d.status is ScoreStatus.SCORED},
            preview=picture.png,
            note=picture.note,
        )


def _elapsed(start: float | None, end: float | None) -> float | None:
    # Clocks of different hosts: a negative span is skew, not time travel.
    return None if start is None or end is None else max(0.0, end - start)


def _sandbox_s(scored: ScoredRollout) -> float:
    """Seconds in tool calls: their own durations, else the rollout's total tool time.

    The generator records both from the same clock; the total is the fallback for
    rollouts whose calls carry no durations.
    """
    rollout = scored.rollout
    return sum(c.duration_s for c in rollout.tool_calls) or rollout.timings.tool_s


# --------------------------------------------------------------------------- one domain


def domain_report(outcomes: Sequence[Outcome], k: int) -> dict[str, Any]:
    """The three tiers of one domain's outcomes; pass@k with ``k`` samples per problem."""
    names = {o.domain for o in outcomes}
    if len(names) != 1:
        raise ValueError(f"a domain report needs the outcomes of one domain, not {sorted(names)}")
    judged = _judged(outcomes)
    report = {
        "family": outcomes[0].family,
        "problems": len({o.problem for o in outcomes}),
        "rollouts": len(outcomes),
        "unit": unit_tier(outcomes, k),
        "chain": chain_tier(outcomes) if any(o.multi_turn for o in outcomes) else None,
        "system": system_tier(outcomes),
        "validators": _validator_means(judged),
        "completion_tokens_mean": fmean(o.completion_tokens for o in judged) if judged else 0.0,
    }
    previews = domain_previews(outcomes)
    if previews:  # only domains whose validator draws (CAD parts)
        report["previews"] = previews
    return report


def unit_tier(outcomes: Sequence[Outcome], k: int) -> dict[str, Any]:
    judged = _judged(outcomes)
    greedy = [o for o in judged if o.greedy]
    answers = _pass_rollouts(outcomes)
    by_problem = _correct_by_problem(answers)
    calls = sum(o.tool_calls for o in judged)
    ran = calls - sum(o.tool_format_errors for o in judged)
    code = _is_code(outcomes[0].family) if outcomes else False
    return {
        "greedy": _rate(greedy).to_json(),
        "pass_at_1": _problem_mean([sum(c) / len(c) for c in by_problem]).to_json(),
        "pass_at_k": _problem_mean(_pass_at_k_values(by_problem, k)).to_json(),
        "k": max((min(k, len(c)) for c in by_problem), default=k),
        "tool_format": wilson(ran, calls).to_json() if calls else None,
        "code_pass": _rate(answers).to_json() if code else None,
    }


def chain_tier(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    judged = _judged(outcomes)
    stumbled = [o for o in judged if o.tool_errors]
    calls = sum(o.tool_calls for o in judged)
    errors = sum(o.tool_errors for o in judged)
    return {
        "completion_rate": wilson(sum(o.finished for o in judged), len(judged)).to_json(),
        "success_rate": _rate(judged).to_json(),
        "turns": _histogram([o.turns for o in judged]),
        "attempts": _histogram([o.tool_calls for o in judged]),
        "recovery_rate": _rate(stumbled).to_json() if stumbled else None,
        "tool_error_rate": wilson(errors, calls).to_json() if calls else None,
    }


def system_tier(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    n = len(outcomes)
    totals = {key: float(sum(getattr(o, key) for o in outcomes)) for key in COST_KEYS}
    latencies = [o.latency_s for o in outcomes if o.latency_s is not None]
    return {
        "success_rate": _rate(_judged(outcomes)).to_json(),
        "infra_failure_rate": wilson(sum(o.status == INFRA for o in outcomes), n).to_json(),
        "invalid_rate": wilson(sum(o.status == INVALID for o in outcomes), n).to_json(),
        "latency_s": percentiles(latencies),
        "cost_per_task": {key: total / n if n else 0.0 for key, total in totals.items()},
        "cost_total": totals,
        **per_solved(_judged(outcomes)),
    }


def per_solved(judged: Sequence[Outcome]) -> dict[str, Any]:
    """What a solved task cost, every attempt's cost included (the failed ones were spent
    to get it), with a bootstrap interval; nothing when no task was solved."""
    solved = [float(o.correct) for o in judged]
    figures: dict[str, Any] = {}
    for name, key in PER_SOLVED:
        costs = [float(getattr(o, key)) for o in judged]
        # No cost of that kind (no sandbox in a single-turn domain): nothing to compare.
        found = bootstrap_ratio(costs, solved) if any(costs) else None
        if found is not None:
            figures[name] = found.to_json()
    return figures


def _judged(outcomes: Sequence[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.status != INFRA]


def _pass_rollouts(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The rollouts pass@1 and pass@k are taken over: sampled ones, else the greedy ones."""
    judged = _judged(outcomes)
    return [o for o in judged if not o.greedy] or judged


def _correct_by_problem(outcomes: Sequence[Outcome]) -> list[list[bool]]:
    """Correctness per problem, problems in a fixed order so the bootstrap repeats."""
    found: defaultdict[tuple[str, str], list[bool]] = defaultdict(list)
    for o in outcomes:
        found[(o.domain, o.problem)].append(o.correct)
    return [found[key] for key in sorted(found)]


def _pass_at_k_values(by_problem: Sequence[Sequence[bool]], k: int) -> list[float]:
    return [pass_at_k(len(c), sum(c), min(k, len(c))) for c in by_problem]


def _problem_mean(values: Sequence[float]) -> Interval:
    # No problem measured: no claim at all, as a rate with no trials.
    if not values:
        return wilson(0, 0)
    interval = bootstrap_mean(values)
    if interval.low == interval.high and interval.value in (0.0, 1.0):
        # Every problem failed (or passed): resampling cannot vary, and [0%, 0%] would
        # claim a certainty 20 problems do not give.  Wilson over problems does not.
        bound = wilson(round(interval.value * len(values)), len(values))
        return Interval(value=interval.value, low=bound.low, high=bound.high, n=len(values))
    return interval


def _rate(outcomes: Sequence[Outcome]) -> Interval:
    return wilson(sum(o.correct for o in outcomes), len(outcomes))


def _is_code(family: str) -> bool:
    lowered = family.lower()
    return "python" in lowered or "code" in lowered


def _histogram(values: Sequence[int]) -> dict[str, Any]:
    counts = Counter(values)
    return {
        "mean": fmean(values) if values else 0.0,
        "hist": {str(v): counts[v] for v in sorted(counts)},
    }


def _validator_means(outcomes: Sequence[Outcome]) -> dict[str, float]:
    scores: defaultdict[str, list[float]] = defaultdict(list)
    for o in outcomes:
        for name, score in o.validators.items():
            scores[name].append(score)
    return {name: fmean(scores[name]) for name in sorted(scores)}


# --------------------------------------------------------------------------- whole report


def build_report(
    outcomes: Sequence[Outcome], *, k: int, policy: str, version: int | None, worst: int = 5
) -> dict[str, Any]:
    """``report.json``: every domain's tiers, per-family and overall summaries."""
    by_domain = _group(outcomes, lambda o: o.domain)
    domains = {name: domain_report(items, k) for name, items in by_domain.items()}
    families = {
        family: _summary({o.domain: domains[o.domain] for o in items}, items, k)
        for family, items in _group(outcomes, lambda o: o.family).items()
    }
    overall = _summary(domains, outcomes, k)
    overall["worst"] = _worst(domains, worst)
    return {
        "schema": SCHEMA,
        "policy": policy,
        "version": version,
        "samples": k,
        "domains": domains,
        "families": families,
        "overall": overall,
    }


def _group(outcomes: Sequence[Outcome], key: Callable[[Outcome], str]) -> dict[str, list[Outcome]]:
    found: defaultdict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        found[key(o)].append(o)
    return {name: found[name] for name in sorted(found)}


def _summary(
    domains: dict[str, dict[str, Any]], outcomes: Sequence[Outcome], k: int
) -> dict[str, Any]:
    return {"domains": len(domains), "macro": _macro(domains), "micro": _micro(outcomes, k)}


def _macro(domains: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Unweighted mean over domains; a domain with nothing measured for a key is left out."""
    macro: dict[str, float | None] = {}
    for key in SUMMARY_KEYS:
        tier = "system" if key in ("success_rate", "infra_failure_rate") else "unit"
        figures = [d[tier][key] for d in domains.values()]
        values = [f["value"] for f in figures if f["n"]]
        macro[key] = fmean(values) if values else None
    return macro


def _micro(outcomes: Sequence[Outcome], k: int) -> dict[str, dict[str, float | int]]:
    """Pooled over rollouts (pass@k: over problems) of every domain."""
    judged = _judged(outcomes)
    answers = [
        o for items in _group(outcomes, lambda o: o.domain).values() for o in _pass_rollouts(items)
    ]
    return {
        "greedy": _rate([o for o in judged if o.greedy]).to_json(),
        "pass_at_1": _rate(answers).to_json(),
        "pass_at_k": _problem_mean(_pass_at_k_values(_correct_by_problem(answers), k)).to_json(),
        "success_rate": _rate(judged).to_json(),
        "infra_failure_rate": wilson(len(outcomes) - len(judged), len(outcomes)).to_json(),
    }


def _worst(domains: dict[str, dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The ``count`` domains of lowest pass@1; a domain with no answer judged is not ranked."""
    figures = {name: d["unit"]["pass_at_1"] for name, d in domains.items()}
    ranked = sorted((f["value"], name) for name, f in figures.items() if f["n"])
    return [{"domain": name, "pass_at_1": value} for value, name in ranked[:count]]
