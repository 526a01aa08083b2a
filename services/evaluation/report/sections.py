"""The report's training sections: summary, reward, held-out, staleness, throughput."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from services.evaluation.report import plots
from services.evaluation.report.document import (
    Block,
    Section,
    Table,
    change,
    duration,
    figures,
    interval,
    num,
    pct,
)
from services.evaluation.report.run_data import (
    METRICS,
    Heldout,
    RunData,
    Step,
    sample_staleness,
)
from services.evaluation.report.tier_reports import TierReport
from services.evaluation.watch import Review, thirds

#: How to get a run directory's files, for the sections that find one missing.
HOW_TO_RUN = "temper train --run-dir RUN_DIR writes it"
#: What the sections that would use tier reports say when there are none.
NO_TIERS = "eval/tiers/ is absent (the Tiers section says how to get it)"
HOW_TO_TIERS = (
    "eval/tiers/ is absent: no per-tier figures. temper train writes eval/tiers/v<version>.json "
    "with every held-out evaluation (at the start, every --eval-every versions, at the end) "
    "once its evaluations are tiered: train again, or save the report.json of temper eval "
    "--policy (the same schema) there as v<version>.json"
)


# ---------------------------------------------------------------- summary


def summary(run: RunData, review: Review) -> Section:
    blocks: list[Block] = [f"Run directory: {run.run_dir}"]
    blocks.extend(_training_lines(run.steps))
    table = _heldout_change(run.heldout)
    if table is not None:
        blocks.append(table)
    tiers = ", ".join(r.label for r in run.tiers) or "none"
    blocks.append(f"Tier reports: {len(run.tiers)} ({tiers})")
    blocks.append(f"Reward-hacking watch: {len(review.flags)} flag(s); see the watch section")
    missing = [f"{name} is absent" for name in run.missing]
    if run.skipped:
        shown = ", ".join(run.skipped[:5])
        more = f" (+{len(run.skipped) - 5} more)" if len(run.skipped) > 5 else ""
        missing.append(f"unreadable lines or files skipped: {shown}{more}")
    return Section("summary", "Summary", tuple(blocks), tuple(missing))


def _training_lines(steps: Sequence[Step]) -> list[Block]:
    if not steps:
        return [f"No learner steps ({METRICS} is empty or absent)."]
    first, last = steps[0], steps[-1]
    seconds = last.at - first.at
    samples = sum(s.figure("samples") or 0.0 for s in steps)
    trained = sum(s.figure("trained") or 0.0 for s in steps)
    return [
        f"Learner steps: {len(steps)} (step {first.step} to {last.step}); policy versions "
        f"{first.version} to {last.version}",
        f"Duration: {duration(seconds)} from the first learner step to the last; "
        f"{samples:,.0f} samples consumed, {trained:,.0f} of them through the forward pass "
        "(the rest had advantage 0)",
    ]


def _heldout_change(points: Sequence[Heldout]) -> Table | None:
    rows = []
    for domain, series in _by_domain(points).items():
        start, end = series[0], series[-1]
        rows.append(
            (
                domain,
                f"v{start.version}",
                pct(start.greedy),
                f"v{end.version}",
                pct(end.greedy),
                change(start.greedy, end.greedy),
                _pass_at_k(start),
                _pass_at_k(end),
                pct(end.chance),
            )
        )
    if not rows:
        return None
    headers = (
        "domain",
        "start version",
        "start greedy",
        "end version",
        "end greedy",
        "change",
        "start pass@k",
        "end pass@k",
        "chance",
    )
    return Table(headers, tuple(rows), "Held-out greedy accuracy, start to end")


def _pass_at_k(point: Heldout) -> str:
    """pass@k, k named: where greedy is low and pass@k high, reinforcement learning has room."""
    return "-" if point.pass_at_k is None else f"{pct(point.pass_at_k)} (k={point.k})"


def _by_domain(points: Sequence[Heldout]) -> dict[str, list[Heldout]]:
    found: dict[str, list[Heldout]] = {}
    for point in sorted(points, key=lambda p: p.version):
        found.setdefault(point.domain, []).append(point)
    return found


# ---------------------------------------------------------------- reward


def reward(run: RunData, draw: bool) -> Section:
    if not run.steps:
        return Section("reward", "Train reward", (), (f"{METRICS} is absent: {HOW_TO_RUN}",))
    blocks: list[Block] = []
    blocks += figures(
        draw, "Train reward per domain over learner steps", lambda: plots.reward(run.steps)
    )
    rows = [_reward_row("all domains (batch mean)", [s.reward_mean for s in run.steps])]
    for domain in dict.fromkeys(d for s in run.steps for d in s.reward_by_domain):
        values = [s.reward_by_domain[domain] for s in run.steps if domain in s.reward_by_domain]
        rows.append(_reward_row(domain, values))
    headers = ("domain", "steps", "first third", "last third", "change", "last step")
    blocks.append(Table(headers, tuple(rows), "Train reward (reward_by_domain, reward_mean)"))
    return Section("reward", "Train reward", tuple(blocks))


def _reward_row(label: str, values: Sequence[float]) -> tuple[str, ...]:
    before, after = thirds(values)
    return (
        label,
        str(len(values)),
        num(before),
        num(after),
        f"{after - before:+.3f}",
        num(values[-1]),
    )


# ---------------------------------------------------------------- held-out


def heldout(run: RunData, draw: bool) -> Section:
    blocks: list[Block] = []
    missing: list[str] = []
    if run.heldout:
        caption = "Held-out accuracy over policy versions (eval/heldout.jsonl)"
        blocks += figures(draw, caption, lambda: plots.heldout(run.heldout))
        blocks.append(_heldout_table(run.heldout))
    else:
        missing.append(f"eval/heldout.jsonl is absent: no held-out accuracy ({HOW_TO_RUN})")
    if run.tiers:
        caption = "Per-tier figures over policy versions (eval/tiers/), 95% intervals"
        blocks += figures(draw, caption, lambda: plots.tier_trends(run.tiers))
        blocks.append(_tier_trend_table(run.tiers))
    else:
        missing.append(f"no per-tier figures over versions: {NO_TIERS}")
    return Section("heldout", "Held-out accuracy", tuple(blocks), tuple(missing))


def _heldout_table(points: Sequence[Heldout]) -> Table:
    rows = [
        (
            p.domain,
            f"v{p.version}",
            f"{p.elapsed_s:.0f}",
            pct(p.greedy),
            pct(p.sampled),
            f"{pct(p.pass_at_k)} (k={p.k})",
            str(p.problems),
            pct(p.chance),
        )
        for series in _by_domain(points).values()
        for p in series
    ]
    headers = ("domain", "version", "at (s)", "greedy", "sampled", "pass@k", "problems", "chance")
    return Table(headers, tuple(rows), "Held-out evaluations")


def _tier_trend_table(reports: Sequence[TierReport]) -> Table:
    rows = []
    for report in reports:
        for name, tiers in report.domains.items():
            chain = None if tiers.chain is None else tiers.chain.success_rate
            rows.append(
                (
                    report.label,
                    name,
                    interval(tiers.unit.greedy),
                    interval(tiers.unit.pass_at_1),
                    f"{interval(tiers.unit.pass_at_k)} (k={tiers.unit.k})",
                    interval(chain),
                    interval(tiers.system.success_rate),
                )
            )
    headers = (
        "report",
        "domain",
        "unit greedy",
        "unit pass@1",
        "unit pass@k",
        "chain success",
        "system success",
    )
    return Table(headers, tuple(rows), "Tier figures per report (95% intervals)")


# ---------------------------------------------------------------- staleness


def staleness(run: RunData, draw: bool) -> Section:
    values = [v for s in run.steps if (v := s.figure("staleness_mean")) is not None]
    if not values:
        reason = f"{METRICS} is absent" if not run.steps else f"{METRICS} has no staleness_mean"
        return Section("staleness", "Staleness", (), (reason,))
    blocks: list[Block] = []
    blocks += figures(
        draw, "Staleness over learner steps and its histogram", lambda: plots.staleness(run.steps)
    )
    dropped = sum(s.figure("dropped_stale") or 0.0 for s in run.steps)
    blocks.append(
        f"Mean staleness per step (versions the trained samples lag the learner): mean "
        f"{statistics.fmean(values):.2f}, max {max(values):.2f}; samples dropped as too "
        f"stale: {dropped:,.0f}"
    )
    counts = sample_staleness(run.steps)
    if counts:
        blocks.append(_staleness_table(counts))
        return Section("staleness", "Staleness", tuple(blocks))
    missing = (
        f"{METRICS} has no staleness_counts (metrics from before the learner recorded "
        "each sample's staleness): the histogram is over per-step means, not over samples",
    )
    return Section("staleness", "Staleness", tuple(blocks), missing)


def _staleness_table(counts: dict[int, int]) -> Table:
    total = sum(counts.values())
    rows = tuple((str(behind), f"{n:,}", pct(n / total)) for behind, n in counts.items())
    return Table(
        ("versions behind", "samples", "share"),
        rows,
        "Samples the learner consumed, by staleness, all steps (staleness_counts)",
    )


# ---------------------------------------------------------------- throughput

#: Per-step figures of metrics.jsonl shown as rates: label -> key.
_RATES = {"samples/s": "samples", "trained tokens/s": "loss_tokens"}


def throughput(run: RunData, draw: bool) -> Section:
    blocks: list[Block] = []
    missing: list[str] = []
    if len(run.steps) >= 2:
        blocks += figures(
            draw, "Learner throughput over steps", lambda: plots.throughput(run.steps, _RATES)
        )
        blocks.append(_learner_rates(run.steps))
        stages = _stage_table(run.steps)
        if stages is not None:
            blocks.append(stages)
    else:
        missing.append(f"{METRICS} has fewer than two steps: no learner rates")
    generators = _generator_table(run)
    if generators is None:
        missing.append(
            "stats.json has no generator entry: no generated tokens/s or prefix-cache hit rate "
            "(temper train writes stats.json when it stops)"
        )
    else:
        blocks.append(generators)
    return Section("throughput", "Throughput", tuple(blocks), tuple(missing))


def _learner_rates(steps: Sequence[Step]) -> Table:
    seconds = steps[-1].at - steps[0].at
    rows = []
    for label, key in _RATES.items():
        total = sum(s.figure(key) or 0.0 for s in steps[1:])
        rows.append((label, key, num(total / seconds if seconds > 0 else None)))
    rows.append(
        ("steps/min", "step", num(60 * (len(steps) - 1) / seconds if seconds > 0 else None))
    )
    return Table(
        ("rate", "from metrics.jsonl key", "run mean"),
        tuple(rows),
        "Learner rates (first to last step)",
    )


def _stage_table(steps: Sequence[Step]) -> Table | None:
    stages = sorted({k for s in steps for k in s.figures if k.startswith("time_")})
    if not stages:
        return None
    means = {k: sum(s.figure(k) or 0.0 for s in steps) / len(steps) for k in stages}
    total = sum(means.values()) or 1.0
    rows = tuple(
        (k.removeprefix("time_"), num(means[k]), pct(means[k] / total))
        for k in sorted(stages, key=lambda k: -means[k])
    )
    return Table(("learner stage", "mean s/step", "share"), rows, "Learner time per step (time_*)")


def _generator_table(run: RunData) -> Table | None:
    generators = run.service("generator")
    if not generators:
        return None
    rows = tuple(
        (
            g.key,
            num(g.values.get("tokens_per_s")),
            num(g.values.get("generated_tokens")),
            pct(g.values.get("cache_hit_ratio")),
            num(g.values.get("decode_rows_per_step")),
            num(g.values.get("uptime_s")),
        )
        for g in generators
    )
    headers = (
        "generator",
        "tokens/s",
        "tokens",
        "prefix-cache hits",
        "rows/decode step",
        "uptime (s)",
    )
    return Table(headers, rows, "Generators (stats.json, last stats before the run stopped)")
