"""Where the embedded stack's time went, from a ``temper train`` run directory.

The learner's stages come from its ``metrics.jsonl`` (seconds per step); the other
services' from ``stats.json``, the last Stats of every process, whose ``time_<stage>_s``
totals are divided by the work they cover.  Shared by the end-to-end benchmarks.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def learner_steps(run: Path) -> list[dict[str, Any]]:
    lines = (run / "learner" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def learner_stages(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Mean seconds per learner stage, and between steps (the learner's cycle)."""
    means = {
        key[len("time_") :]: statistics.fmean(s.get(key, 0.0) for s in steps)
        for key in sorted({k for s in steps for k in s if k.startswith("time_")})
    }
    if len(steps) > 1:
        means["cycle"] = (steps[-1]["at"] - steps[0]["at"]) / (len(steps) - 1)
    return means


def service_totals(run: Path) -> dict[str, dict[str, float]]:
    """Each service's figures, summed over its instances."""
    path = run / "stats.json"
    if not path.is_file():
        return {}
    totals: dict[str, dict[str, float]] = {}
    for entry in json.loads(path.read_text()).values():
        into = totals.setdefault(entry["service"], {})
        for key, value in entry["values"].items():
            into[key] = into.get(key, 0.0) + float(value)
    return totals


def service_lines(run: Path, batch: int) -> list[str]:
    """The generator's, validator's and replay buffer's time, per learner batch of samples
    (engine and validator: busy seconds) or per item (latencies)."""
    totals = service_totals(run)
    gen, val, rep = (totals.get(name, {}) for name in ("generator", "validator", "replay"))
    samples = sum(v for k, v in gen.items() if k.startswith("rollouts_"))
    if not samples:
        return ["(no stats.json figures: services' stages not shown)"]
    per_batch = batch / samples
    lines = [
        f"generator engine busy per batch of {batch}: "
        f"prefill {_ms(gen, 'prefill', per_batch)}, decode {_ms(gen, 'decode', per_batch)}",
        f"generator per task: admission wait {_mean(gen, 'admission')}, generation "
        f"{_mean(gen, 'generate')}, rollout publish {_mean(gen, 'publish')}; "
        f"weight reload {_mean(gen, 'weight_reload')} x {gen.get('count_weight_reload', 0):.0f}",
    ]
    if gen.get("count_tool"):
        lines.append(
            f"generator tool execution (agent domains): {gen['time_tool_s'] / samples * 1000:.0f}"
            f" ms per sample, in a task of {_mean(gen, 'generate')} (its samples call at once); "
            f"infra failures {gen.get('rollouts_infra_failure', 0):.0f} of {samples:.0f} samples"
        )
    if val:
        lines.append(f"validator busy per batch: {_ms(val, 'validate', batch / max(samples, 1))}")
    if rep:
        lines.append(
            f"replay: held {_mean(rep, 'hold')} per rollout, batch selection "
            f"{_mean(rep, 'select')} per request; dropped stale {rep.get('dropped_stale', 0):.0f}"
            f" of {rep.get('received', 0):.0f} received"
        )
    return lines


def _ms(values: dict[str, float], stage: str, scale: float) -> str:
    return f"{values.get(f'time_{stage}_s', 0.0) * scale * 1000:.0f} ms"


def _mean(values: dict[str, float], stage: str) -> str:
    count = values.get(f"count_{stage}", 0.0)
    if not count:
        return "-"
    return f"{values[f'time_{stage}_s'] / count * 1000:.1f} ms"
