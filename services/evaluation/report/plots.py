"""The report's figures, each rendered to PNG bytes (``None`` when there is nothing to plot).

matplotlib is imported inside the functions, with the Agg backend, so that importing the
report (or the CLI) costs nothing and needs no display.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from services.evaluation.report.run_data import Heldout, Step, sample_staleness
from services.evaluation.report.tier_reports import DomainTiers, Interval, TierReport

_DPI = 100
_WIDE = (9.0, 4.0)
_COLUMNS = 3


def render(draw: Callable[[Any], None], size: tuple[float, float], panels: int = 1) -> bytes:
    """``panels`` axes, at most three a row, drawn by ``draw(axes_list)``, as PNG.

    ``size`` is one row's; a figure of more rows is that much taller.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(panels, _COLUMNS)
    rows = -(-panels // columns)
    figure, grid = plt.subplots(rows, columns, figsize=(size[0], size[1] * rows), squeeze=False)
    axes = [ax for row in grid for ax in row]
    for spare in axes[panels:]:
        spare.set_visible(False)
    try:
        draw(axes[:panels])
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=_DPI)
    finally:
        plt.close(figure)
    return buffer.getvalue()


def rolling(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over ``window`` values (fewer at the start)."""
    out = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


def _smooth_window(count: int) -> int:
    return max(1, count // 20)


def _style(axes: Any, title: str, xlabel: str, ylabel: str, legend: bool = True) -> None:
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if legend and axes.get_legend_handles_labels()[0]:
        axes.legend(loc="best", fontsize="small")


# ---------------------------------------------------------------- reward


def reward(steps: Sequence[Step]) -> bytes | None:
    if not steps:
        return None

    def draw(axes: list[Any]) -> None:
        ax = axes[0]
        x = [s.step for s in steps]
        window = _smooth_window(len(steps))
        domains = _domains(steps)
        for domain in domains:
            points = [
                (s.step, r) for s in steps if (r := s.reward_by_domain.get(domain)) is not None
            ]
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            (line,) = ax.plot(xs, ys, lw=0.8, alpha=0.35)
            ax.plot(xs, rolling(ys, window), lw=1.8, color=line.get_color(), label=domain)
        # With one domain the batch mean is that domain's curve: drawn twice it hides it.
        if len(domains) != 1:
            mean = rolling([s.reward_mean for s in steps], window)
            ax.plot(x, mean, "k--", lw=1.4, label="all domains (batch mean)")
        title = "Train reward per domain"
        if window > 1:
            title += f" (thin: per step; thick: mean of {window} steps)"
        _style(ax, title, "learner step", "reward (batch mean)")

    return render(draw, _WIDE)


def _domains(steps: Sequence[Step]) -> list[str]:
    seen: dict[str, None] = {}
    for step in steps:
        seen.update(dict.fromkeys(step.reward_by_domain))
    return list(seen)


# ---------------------------------------------------------------- held-out


def heldout(points: Sequence[Heldout]) -> bytes | None:
    """Per domain, greedy, sampled and pass@k against wall clock; with several domains, a
    first panel of every domain's greedy accuracy together."""
    by_domain: dict[str, list[Heldout]] = {}
    for point in sorted(points, key=lambda p: (p.elapsed_s, p.version)):
        by_domain.setdefault(point.domain, []).append(point)
    if not by_domain:
        return None

    def draw(axes: list[Any]) -> None:
        panels = iter(axes)
        if len(by_domain) > 1:
            _all_domains_panel(next(panels), by_domain)
        for ax, (domain, series) in zip(panels, by_domain.items(), strict=True):
            _heldout_panel(ax, domain, series)

    panels = len(by_domain) + (len(by_domain) > 1)
    return render(draw, (max(6.0, 4.5 * min(panels, _COLUMNS)), 4.0), panels)


def _all_domains_panel(ax: Any, by_domain: dict[str, list[Heldout]]) -> None:
    for domain, series in by_domain.items():
        ax.plot([p.elapsed_s for p in series], [p.greedy for p in series], ".-", label=domain)
    ax.set_ylim(0, 1)
    _style(ax, "Held-out greedy accuracy, every domain", _CLOCK, "accuracy")


def _heldout_panel(ax: Any, domain: str, series: list[Heldout]) -> None:
    clock = [p.elapsed_s for p in series]
    ax.plot(clock, [p.greedy for p in series], "o-", label="greedy")
    ax.plot(clock, [p.sampled for p in series], "s--", label="sampled")
    with_k = [p for p in series if p.pass_at_k is not None]
    if with_k:
        k = with_k[-1].k
        clock_k, values_k = [p.elapsed_s for p in with_k], [p.pass_at_k for p in with_k]
        ax.plot(clock_k, values_k, "^:", label=f"pass@{k}")
    chance = series[-1].chance
    if chance is not None:
        ax.axhline(chance, color="grey", ls=":", label="chance")
    ax.set_ylim(0, 1)
    _style(ax, f"Held-out accuracy: {domain}", _CLOCK, "accuracy")


_CLOCK = "seconds of training"


# ---------------------------------------------------------------- tiers

Pick = Callable[[DomainTiers], Interval | None]


def _chain_success(domain: DomainTiers) -> Interval | None:
    return None if domain.chain is None else domain.chain.success_rate


#: The per-tier figures over versions: a panel title and where the figure is.
_TIER_PANELS: tuple[tuple[str, Pick], ...] = (
    ("Unit: pass@1", lambda d: d.unit.pass_at_1),
    ("Chain: success rate", _chain_success),
    ("System: success rate", lambda d: d.system.success_rate),
)


def tier_trends(reports: Sequence[TierReport]) -> bytes | None:
    if not reports:
        return None

    def draw(axes: list[Any]) -> None:
        for ax, (title, pick) in zip(axes, _TIER_PANELS, strict=True):
            _interval_panel(ax, reports, pick)
            ax.set_ylim(0, 1)
            _style(ax, title, "policy version", "rate (95% interval)")

    return render(draw, (13.0, 4.0), len(_TIER_PANELS))


def infra_failures(reports: Sequence[TierReport]) -> bytes | None:
    if not reports:
        return None

    def draw(axes: list[Any]) -> None:
        _interval_panel(axes[0], reports, lambda d: d.system.infra_failure_rate)
        _style(axes[0], "Infra-failure rate per domain", "policy version", "rate (95% interval)")

    return render(draw, (7.0, 3.6))


def _interval_panel(ax: Any, reports: Sequence[TierReport], pick: Pick) -> None:
    names = list(dict.fromkeys(n for r in reports for n in r.domains))
    for name in names:
        points = _version_points(reports, name, pick)
        if not points:
            continue
        xs = [p[0] for p in points]
        values = [p[1].value for p in points]
        below = [max(0.0, p[1].value - p[1].low) for p in points]
        above = [max(0.0, p[1].high - p[1].value) for p in points]
        ax.errorbar(xs, values, yerr=[below, above], fmt="o-", capsize=3, label=name)
    if not ax.get_legend_handles_labels()[0]:
        ax.text(
            0.5,
            0.5,
            "no domain has this tier",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="grey",
        )


def _version_points(
    reports: Sequence[TierReport], name: str, pick: Pick
) -> list[tuple[int, Interval]]:
    points = []
    for report in reports:
        if name not in report.domains:
            continue
        interval = pick(report.domains[name])
        if interval is not None:
            points.append((0 if report.version is None else report.version, interval))
    return points


# ---------------------------------------------------------------- staleness


def staleness(steps: Sequence[Step]) -> bytes | None:
    """Per-step mean over steps, and a histogram: over samples when the steps carry
    ``staleness_counts``, else over the per-step means (older metrics)."""
    points = [(s.step, v) for s in steps if (v := s.figure("staleness_mean")) is not None]
    if not points:
        return None
    counts = sample_staleness(steps)

    def draw(axes: list[Any]) -> None:
        over, spread = axes
        over.plot([p[0] for p in points], [p[1] for p in points], lw=1.0, label="batch mean")
        _style(over, "Staleness per learner step", "learner step", "versions behind the learner")
        if counts:
            _sample_histogram(spread, counts)
        else:
            _mean_histogram(spread, [p[1] for p in points])

    return render(draw, _WIDE, 2)


def _sample_histogram(ax: Any, counts: Mapping[int, int]) -> None:
    from matplotlib.ticker import MaxNLocator

    # A bar for every whole version up to the largest lag, so a gap shows as a gap.
    behind = list(range(max(counts) + 1))
    ax.bar(behind, [counts.get(b, 0) for b in behind], color="tab:orange", edgecolor="black")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _style(ax, "Samples by staleness (all steps)", "versions behind", "samples", legend=False)


def _mean_histogram(ax: Any, values: Sequence[float]) -> None:
    ax.hist(values, bins=_bins(values), color="tab:orange", edgecolor="black")
    _style(
        ax,
        "Histogram of per-step mean staleness",
        "versions behind",
        "learner steps",
        legend=False,
    )


def _bins(values: Sequence[float]) -> list[float]:
    """Quarter-version bins from 0: per-step means of whole-version lags fall on them."""
    top = max(1.0, max(values))
    count = min(120, int(top * 4) + 1)
    return [(i - 0.5) / 4 for i in range(count + 1)]


# ---------------------------------------------------------------- throughput


def rates(steps: Sequence[Step], key: str) -> list[tuple[int, float]]:
    """Per-step rate of the figure ``key`` over the wall-clock gap since the last step."""
    out = []
    for before, after in itertools.pairwise(steps):
        value = after.figure(key)
        gap = after.at - before.at
        if value is not None and gap > 0:
            out.append((after.step, value / gap))
    return out


def throughput(steps: Sequence[Step], series: Mapping[str, str]) -> bytes | None:
    """One panel per ``label -> metrics key``: that figure per second over steps."""
    found = {label: rates(steps, key) for label, key in series.items()}
    found = {label: points for label, points in found.items() if points}
    if not found:
        return None
    seconds = steps[-1].at - steps[0].at

    def draw(axes: list[Any]) -> None:
        for ax, (label, points) in zip(axes, found.items(), strict=True):
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            window = _smooth_window(len(ys))
            ax.plot(xs, ys, lw=0.8, alpha=0.4, label="per step")
            if window > 1:
                ax.plot(xs, rolling(ys, window), lw=1.8, label=f"mean of {window} steps")
            # The whole run's total over its time, as the report's table gives it: a mean
            # of per-step rates would weigh a fast step as much as a slow one.
            total = sum(s.figure(series[label]) or 0.0 for s in steps[1:])
            if seconds > 0:
                ax.axhline(total / seconds, color="grey", ls=":", label="run (total / time)")
            _style(ax, f"Learner: {label}", "learner step", label)

    return render(draw, _WIDE if len(found) > 1 else (7.0, 4.0), len(found))
