"""The learner's proof that it trains on what was sampled, judged: ``logprob_mismatch``
(``metrics.jsonl``) is the mean ``|learner - behaviour|`` logprob over the trained tokens
of the samples the learner's own weights generated, before the step's update.  Only the
numerics of the engine and the dtype separate the two; a step over the bound for its
engine and dtype means the learner trains on something other than what was sampled (a
re-tokenized turn, shifted positions, a wrong mask, an engine serving other weights).
"""

from __future__ import annotations

from services.evaluation.report.run_data import RunData, Step

#: Bound on the mean mismatch (nats) per (engine, dtype): the generators sample with
#: ``engine``; the learner computes in ``dtype`` (float32 on a CPU, bf16 on a GPU), which
#: is the engine's too unless a run sets them apart.
THRESHOLDS: dict[tuple[str, str], float] = {
    # The same transformers model and weights on both sides: only batching, padding and
    # the KV cache change the order of float32 sums (4e-8 nats mean, 5e-7 max on the
    # tiny model).  1e-3 leaves room for deeper models and still catches any wiring
    # error (~0.1-1).
    ("torch", "float32"): 1e-3,
    # 8 (bf16) or 11 (fp16) mantissa bits: a relative error near 0.4% (0.05%) per
    # operation, which leaves per-token logprobs of two passes a few 1e-2 apart.
    ("torch", "bfloat16"): 5e-2,
    ("torch", "float16"): 5e-2,
    # Other kernels (fused attention, the prefix cache's reused KV, TF32 matmuls on a
    # GPU) on float32 weights: more than reordered sums, far less than bf16.
    ("sglang", "float32"): 2e-2,
    # Those kernels in half precision against the learner's own pass: twice the bound of
    # one engine against itself.
    ("sglang", "bfloat16"): 1e-1,
    ("sglang", "float16"): 1e-1,
}
#: An engine or dtype outside the table (or a metrics line that names neither): the
#: loosest bound, so precision never flags while a wiring error (~0.1-1 nats) still does.
DEFAULT_THRESHOLD = max(THRESHOLDS.values())

Outcome = tuple[list[tuple[str, str, str, float, float]], list[str]]


def threshold(engine: str, dtype: str) -> float:
    """The bound for samples of ``engine`` (several, comma-separated: the loosest)."""
    engines = [name for name in engine.split(",") if name] or [""]
    return max(THRESHOLDS.get((name, dtype), DEFAULT_THRESHOLD) for name in engines)


def logprob_mismatch(run: RunData, domain: str) -> Outcome:
    """One flag for the worst step over its bound (``domain`` labels it: the figure
    covers the whole batch), with the bound as ``before`` and the step's mismatch as
    ``after``; unchecked when no step measured a token."""
    measured = [s for s in run.steps if (s.figure("logprob_mismatch_tokens") or 0) > 0]
    if not measured:
        return [], [
            "logprob mismatch needs steps that trained samples of the learner's own version "
            "(logprob_mismatch_tokens > 0 in metrics.jsonl)"
        ]
    over = [s for s in measured if _over(s)]
    if not over:
        return [], []
    step = max(over, key=_excess)
    limit = threshold(step.engine, step.dtype)
    value = step.figure("logprob_mismatch") or 0.0
    message = (
        f"step {step.step} (v{step.version}): learner and behaviour logprobs of its own "
        f"version's samples differ by {value:.3g} nats on average (max "
        f"{step.figure('logprob_mismatch_max') or 0.0:.3g}, "
        f"{int(step.figure('logprob_mismatch_tokens') or 0)} tokens), over the "
        f"{step.engine or '?'}/{step.dtype or '?'} bound {limit:g}; {len(over)} of "
        f"{len(measured)} measured steps over theirs"
    )
    return [(domain, "logprob_mismatch", message, limit, value)], []


def _over(step: Step) -> bool:
    value = step.figure("logprob_mismatch")
    # A NaN (non-finite recomputed logprobs) is over any bound.
    return value is not None and not value <= threshold(step.engine, step.dtype)


def _excess(step: Step) -> float:
    value = step.figure("logprob_mismatch") or 0.0
    ratio = value / threshold(step.engine, step.dtype)
    return ratio if ratio == ratio else float("inf")  # NaN counts as the worst
