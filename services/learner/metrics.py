"""What the learner reports per step: a metrics.jsonl line, the same as TensorBoard scalars."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from services.learner.trainer import StepResult

#: Keys of a metrics line that are not scalars to plot.
_NOT_SCALARS = frozenset(
    {"step", "version", "at", "reward_by_domain", "staleness_counts", "domains"}
)
#: Figures of a step that measured no token: 0.0 there would plot as perfect agreement.
_MISMATCH_FIGURES = frozenset({"logprob_mismatch", "logprob_mismatch_max"})


def step_line(
    result: StepResult, version: int, dropped_stale: int, seconds: dict[str, float]
) -> dict[str, Any]:
    """The metrics.jsonl line of one learner step (``time_<stage>``: seconds per stage)."""
    return {
        "step": result.step,
        "version": version,
        "samples": result.samples,
        "trained": result.trained,
        "updates": result.updates,
        "refused": len(result.refused),
        "reward_mean": result.reward_mean,
        "reward_by_domain": result.reward_by_domain,
        "domains": {name: f.as_json() for name, f in result.domains.items()},
        "staleness_mean": result.staleness_mean,
        # JSON object keys are strings: versions behind -> samples.
        "staleness_counts": {str(k): v for k, v in result.staleness_counts.items()},
        "dropped_stale": dropped_stale,
        "diversity": result.diversity,
        "completion_len": result.completion_len,
        "truncated": result.truncated,
        "lr": result.lr,
        # Learner against behaviour logprobs of its own version's samples; the watch
        # judges it by the engine and the dtype (0 tokens: not measured this step).
        "logprob_mismatch": result.logprob_mismatch,
        "logprob_mismatch_max": result.logprob_mismatch_max,
        "logprob_mismatch_tokens": result.logprob_mismatch_tokens,
        "engine": result.engine,
        "dtype": result.dtype,
        **{f"loss_{k}": v for k, v in asdict(result.loss).items()},
        **{f"time_{stage}": round(value, 6) for stage, value in seconds.items()},
        "at": time.time(),
    }


class Scalars:
    """TensorBoard scalars (torch's SummaryWriter), one tag per numeric metric."""

    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(logdir))

    def add(self, line: dict[str, Any], step: int, prefix: str = "learner") -> None:
        wall = float(line.get("at", time.time()))
        for key, value in line.items():
            if key in _NOT_SCALARS or not isinstance(value, int | float):
                continue
            if key in _MISMATCH_FIGURES and not line.get("logprob_mismatch_tokens"):
                continue
            self._writer.add_scalar(f"{prefix}/{key}", value, step, walltime=wall)
        for domain, reward in line.get("reward_by_domain", {}).items():
            self._writer.add_scalar(f"reward/{domain}", reward, step, walltime=wall)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
