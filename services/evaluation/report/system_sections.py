"""The report's system sections: sandbox, tiers (start vs end) and the reward-hacking watch."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from protocol.messages import SandboxStatus
from services.evaluation import watch, watch_mismatch, watch_scores
from services.evaluation.report import plots
from services.evaluation.report.document import (
    Alert,
    Block,
    Section,
    Table,
    change,
    figures,
    interval,
    num,
    pct,
)
from services.evaluation.report.parts import preview_blocks
from services.evaluation.report.run_data import RunData, ServiceStats
from services.evaluation.report.sections import HOW_TO_TIERS, NO_TIERS
from services.evaluation.report.tier_reports import DomainTiers, Interval, TierReport

#: Words in a sandbox stats key that make it a failure count.
_FAILURE_WORDS = (
    "failed",
    "dead_lettered",
    "bad_input",
    *(s.value for s in SandboxStatus if s is not SandboxStatus.OK),
)


# ---------------------------------------------------------------- sandbox


def sandbox(run: RunData, draw: bool) -> Section:
    blocks: list[Block] = []
    missing: list[str] = []
    boxes = run.service("sandbox")
    if boxes:
        blocks.append(_sandbox_table(boxes))
        failures = _failure_table(boxes)
        if failures is not None:
            blocks.append(failures)
        missing.append(
            "the sandbox service counts executions, not their statuses: stats.json has no "
            "per-status counts (timeout, oom, nonzero_exit, ...)"
        )
    else:
        missing.append(
            "stats.json has no sandbox entry: no sandbox service ran (temper train runs tool "
            "calls inside the generator), so no sandbox execs/s"
        )
    statuses = _rollout_statuses(run)
    if statuses is not None:
        blocks.append(statuses)
    if run.tiers:
        caption = "Infra-failure rate per domain over tier reports (95% intervals)"
        blocks += figures(draw, caption, lambda: plots.infra_failures(run.tiers))
        blocks.append(_infra_table(run.tiers))
    else:
        missing.append(f"no infra-failure rate per domain: {NO_TIERS}")
    return Section("sandbox", "Sandbox and failures", tuple(blocks), tuple(missing))


def _sandbox_table(boxes: Sequence[ServiceStats]) -> Table:
    rows = []
    for box in boxes:
        values = box.values
        uptime = values.get("uptime_s", 0.0)
        executed = values.get("executed")
        rate = None if executed is None or uptime <= 0 else executed / uptime
        rows.append(
            (
                box.key,
                num(executed),
                num(rate),
                num(values.get("sessions")),
                num(values.get("sandboxes_created")),
                num(values.get("sandboxes_recycled")),
                num(values.get("cold_start_p50_s")),
            )
        )
    headers = (
        "sandbox",
        "execs",
        "execs/s",
        "sessions",
        "boxes created",
        "recycled",
        "cold start p50 (s)",
    )
    return Table(headers, tuple(rows), "Sandbox service (stats.json; execs/s over its uptime)")


def _failure_table(boxes: Sequence[ServiceStats]) -> Table | None:
    rows = tuple(
        (box.key, key, num(value))
        for box in boxes
        for key, value in sorted(box.values.items())
        if any(word in key for word in _FAILURE_WORDS)
    )
    return Table(("sandbox", "failure figure", "count"), rows, "Sandbox failures") if rows else None


def _rollout_statuses(run: RunData) -> Table | None:
    rows: list[tuple[str, ...]] = []
    for generator in run.service("generator"):
        for key, value in sorted(generator.values.items()):
            if key.startswith("rollouts_"):
                rows.append((generator.key, key.removeprefix("rollouts_"), num(value)))
    for validator in run.service("validator"):
        for key, value in sorted(validator.values.items()):
            if key.startswith("domain.") and key.endswith(("infra_failure_rate", "invalid_rate")):
                domain, figure = key.removeprefix("domain.").rsplit(".", 1)
                rows.append((validator.key, f"{domain}: {figure}", pct(value)))
    if not rows:
        return None
    return Table(
        ("service", "status", "count or rate"),
        tuple(rows),
        "Rollout statuses (generator) and failure rates per domain (validator)",
    )


def _infra_table(reports: Sequence[TierReport]) -> Table:
    rows = tuple(
        (report.label, name, interval(d.system.infra_failure_rate), interval(d.system.invalid_rate))
        for report in reports
        for name, d in report.domains.items()
    )
    return Table(
        ("report", "domain", "infra-failure rate", "invalid rate"),
        rows,
        "System tier failure rates (eval/tiers/)",
    )


# ---------------------------------------------------------------- tiers

Pick = Callable[[DomainTiers], Interval | float | None]

#: The rows of the start-vs-end table: tier, figure, where it is in a domain's report.
TIER_ROWS: tuple[tuple[str, str, Pick], ...] = (
    ("unit", "greedy", lambda d: d.unit.greedy),
    ("unit", "pass@1", lambda d: d.unit.pass_at_1),
    ("unit", "pass@k", lambda d: d.unit.pass_at_k),
    ("unit", "tool format", lambda d: d.unit.tool_format),
    ("unit", "code pass", lambda d: d.unit.code_pass),
    ("chain", "completion rate", lambda d: d.chain.completion_rate if d.chain else None),
    ("chain", "success rate", lambda d: d.chain.success_rate if d.chain else None),
    ("chain", "turns (mean)", lambda d: d.chain.turns_mean if d.chain else None),
    ("chain", "tool calls (mean)", lambda d: d.chain.attempts_mean if d.chain else None),
    ("chain", "recovery rate", lambda d: d.chain.recovery_rate if d.chain else None),
    ("chain", "tool error rate", lambda d: d.chain.tool_error_rate if d.chain else None),
    ("system", "success rate", lambda d: d.system.success_rate),
    ("system", "infra-failure rate", lambda d: d.system.infra_failure_rate),
    ("system", "invalid rate", lambda d: d.system.invalid_rate),
    ("system", "latency p50 (s)", lambda d: d.system.latency_s.get("p50")),
    ("system", "latency p95 (s)", lambda d: d.system.latency_s.get("p95")),
    ("system", "completion tokens/task", lambda d: d.system.cost_per_task.get("completion_tokens")),
    ("system", "generator s/task", lambda d: d.system.cost_per_task.get("generator_s")),
    ("system", "sandbox s/task", lambda d: d.system.cost_per_task.get("sandbox_s")),
    ("system", "validator s/task", lambda d: d.system.cost_per_task.get("validator_s")),
)


def tiers(run: RunData) -> Section:
    if not run.tiers:
        return Section("tiers", "Tiers: start vs end", (), (HOW_TO_TIERS,))
    first, last = run.tiers[0], run.tiers[-1]
    blocks: list[Block] = []
    if first is last:
        blocks.append(f"One tier report ({first.label}): start and end are the same report.")
    names = dict.fromkeys([*first.domains, *last.domains])
    for name in names:
        blocks.append(_domain_table(name, first, last))
    macro = _macro_table(first, last)
    if macro is not None:
        blocks.append(macro)
    blocks.extend(preview_blocks(last))
    return Section("tiers", "Tiers: start vs end", tuple(blocks))


def _domain_table(name: str, first: TierReport, last: TierReport) -> Table:
    start, end = first.domains.get(name), last.domains.get(name)
    rows = []
    for tier, label, pick in TIER_ROWS:
        before = None if start is None else pick(start)
        after = None if end is None else pick(end)
        if before is None and after is None:
            continue
        rows.append((tier, label, shown_value(before), shown_value(after), _delta(before, after)))
    headers = ("tier", "figure", first.label, last.label, "change")
    return Table(headers, tuple(rows), f"{name}: {first.label} vs {last.label}")


def shown_value(value: Interval | float | None) -> str:
    return interval(value) if isinstance(value, Interval) or value is None else num(value)


def _delta(before: Interval | float | None, after: Interval | float | None) -> str:
    if isinstance(before, Interval) and isinstance(after, Interval):
        return change(before.value, after.value)
    if isinstance(before, float) and isinstance(after, float):
        return change(before, after, percent=False)
    return "-"


def _macro_table(first: TierReport, last: TierReport) -> Table | None:
    keys = list(dict.fromkeys([*first.macro, *last.macro]))
    if not keys:
        return None
    rows = tuple(
        (
            key,
            pct(first.macro.get(key)),
            pct(last.macro.get(key)),
            change(first.macro.get(key), last.macro.get(key)),
        )
        for key in keys
    )
    return Table(
        ("macro mean over domains", first.label, last.label, "change"),
        rows,
        "Overall (unweighted mean over domains)",
    )


# ---------------------------------------------------------------- watch


def watch_section(review: watch.Review) -> Section:
    blocks: list[Block] = [Alert(f"{f.domain}: {f.kind}: {f.message}") for f in review.flags]
    if not review.flags:
        blocks.append("No flags: no check found a sign of reward hacking.")
    caption = "What the watch checks (a flag is a prompt to read rollouts, not a verdict)"
    blocks.append(Table(("check", "flags when"), _CHECKS, caption))
    return Section("watch", "Reward-hacking watch", tuple(blocks), review.unchecked)


def _bounds() -> str:
    """The watch's mismatch bounds as ``engine/dtype bound``, one after the other."""
    table = watch_mismatch.THRESHOLDS.items()
    return ", ".join(f"{engine}/{dtype} {bound:g}" for (engine, dtype), bound in table)


_CHECKS: tuple[tuple[str, str], ...] = (
    (
        "reward_vs_heldout",
        f"train reward's last third exceeds its first by {watch.REWARD_RISE} or more while "
        f"held-out greedy accuracy falls (first to last evaluation) by {watch.FALL_Z:g}+ "
        f"standard errors and at least {watch.MIN_FALL:.0%}",
    ),
    (
        "length_drift",
        f"mean completion length changes by {watch.LENGTH_RATIO:g}x or more (metrics.jsonl "
        "completion_len thirds, else completion_tokens_mean of the first and last tier report)",
    ),
    (
        "format_drift",
        f"a format validator's mean score (or unit tool_format) moves by {watch.FORMAT_DRIFT} or "
        "more between the first and the last tier report",
    ),
    (
        "short_top",
        f"the share of a domain's samples at its top score rises by {watch_scores.TOP_RISE} or "
        f"more (first to last third of the steps) while those samples are under "
        f"{watch_scores.SHORT_RATIO:g}x the domain's completion length at the start",
    ),
    (
        "score_jump",
        f"a domain's reward histogram moves by {watch_scores.JUMP_TV} or more (total variation) "
        f"between consecutive versions, and {watch_scores.JUMP_NOISE:g}x what sampling noise "
        f"gives ({watch_scores.MIN_SAMPLES}+ samples each)",
    ),
    (
        "logprob_mismatch",
        "a learner step's mean |learner - behaviour| logprob over the trained tokens of its own "
        "version's samples exceeds the bound of the engine that sampled them and the dtype "
        f"({_bounds()}; else {watch_mismatch.DEFAULT_THRESHOLD:g}): the learner trains on "
        "something other than what was sampled (all domains at once)",
    ),
)
