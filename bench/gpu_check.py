"""Temper on one GPU (or the CPU fallback): each part against the bare work it wraps.

Entry point: ``deploy/gpu/check.sh`` (docs/operations.md, "GPU check").  On a random
Qwen2 built here (``temper model init``'s builder, ``--layers``/``--hidden``), in order,
each section time-boxed:

1. generator: the torch engine's generated tokens/s against Hugging Face ``generate`` on
   the same prompts (sampling at temperature 1, both returning each token's logprob);
2. learner: a learner step (``Trainer.train``) against a bare forward, backward and AdamW
   step on the same model and batch (``bench_learner``'s), both as the models load: bf16
   on a GPU;
3. publication: export + digest check + the torch engine's load against a bare
   safetensors save and load (as ``bench_learner`` times it, on the device);
4. train: ``temper train`` (the whole stack) for ``--train-minutes``: reward per step and
   the held-out figures it reports.

Rounds alternate ours/baseline after one untimed round of each, so both share the
machine's noise; medians are reported with their range.  Every section ends with one
line ``RESULT <section>: ...`` (``FAILED (...)`` when it failed; the exit status is then
1).  Without CUDA (or with ``--device cpu``) it runs the CPU fallback: float32, a smaller
model, shorter boxes; ``--quick`` is the smallest of all (what CI runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch  # noqa: E402
from agent_workload import VOCAB  # noqa: E402
from gpu_check_common import Comparison, Plan, Profile, dtype_name  # noqa: E402
from gpu_check_sections import generator_section, learner_section, publication_section  # noqa: E402
from gpu_check_train import TrainOutcome, train_section  # noqa: E402

from services.model.load import default_dtype  # noqa: E402

SECTIONS = ("generator", "learner", "publication", "train")
#: Held back from the total for the summary and the train section's stop.
_MARGIN_S = 15.0
#: The train section does not start with less time left than this.
_TRAIN_MIN_S = 120.0

PROFILES = {
    "gpu": Profile(
        name="gpu",
        layers=4,
        hidden=1024,
        section_s=30.0,
        prompts=32,
        prompt_tokens=256,
        new_tokens=128,
        batch=256,
        train_minutes=5.0,
    ),
    "cpu": Profile(
        name="cpu",
        layers=2,
        hidden=256,
        section_s=20.0,
        prompts=4,
        prompt_tokens=128,
        new_tokens=32,
        batch=128,
        train_minutes=2.0,
    ),
    # The smallest run that still goes through every section (CI): `temper model init`'s
    # tiny model, one torch thread (on a few shared cores more only wait on each other),
    # and a stack that takes two steps of that policy, not warmed up.  It earns no reward,
    # so every sample is trained on (skipped samples would leave no step to show).
    "quick": Profile(
        name="quick",
        layers=2,
        hidden=128,
        section_s=4.0,
        prompts=4,
        prompt_tokens=32,
        new_tokens=16,
        batch=16,
        train_minutes=1.5,
        train_args=(
            *("--warmup-steps", "0", "--eval-every", "0"),
            *("--eval-samples", "1", "--eval-problems", "8"),
            *("--batch", "16", "--group", "4", "--in-flight", "8", "--max-steps", "2"),
        ),
        train_env={"TEMPER_LEARNER_SKIP_ZERO_ADVANTAGE": "false"},
        train_from_check_model=True,
        threads=1,
    ),
}


# ---------------------------------------------------------------- model


def build_model(path: Path, layers: int, hidden: int) -> Path:
    """A random Qwen2 with ``temper model init``'s tokenizer; head_dim 64 as in real models."""
    from services.model.tiny import TinyModelSpec, init_model

    spec = TinyModelSpec(
        vocab_size=VOCAB,  # the generator workload's token ids are below it
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        layers=layers,
        heads=max(4, hidden // 64),
        kv_heads=2,
    )
    return init_model(path, spec, force=True)


def describe_model(model_dir: Path, plan: Plan) -> str:
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    profile = plan.profile
    return (
        f"model: random Qwen2, {profile.layers} layers, hidden {profile.hidden}, "
        f"{weights / 4e6:.1f}M parameters ({weights / 1e6:.0f} MB float32), vocabulary {VOCAB}"
    )


# ---------------------------------------------------------------- running


def run_sections(plan: Plan, model_dir: Path) -> dict[str, Comparison | TrainOutcome | None]:
    """Each section in turn; a failed one prints its error and leaves None."""
    measures: dict[str, Callable[[Plan, Path], Comparison]] = {
        "generator": generator_section,
        "learner": learner_section,
        "publication": publication_section,
    }
    results: dict[str, Comparison | TrainOutcome | None] = {}
    for name in plan.sections:
        print(f"\n== {name}", flush=True)
        started = time.monotonic()
        try:
            if name == "train":
                results[name] = _train(plan, model_dir)
            else:
                results[name] = _measured(measures[name](plan, model_dir))
        except Exception as error:
            traceback.print_exc(file=sys.stdout)
            print(f"RESULT {name}: FAILED ({type(error).__name__}: {error})", flush=True)
            results[name] = None
        _release(plan)
        print(f"  ({name}: {time.monotonic() - started:.0f} s in all)", flush=True)
    return results


def _measured(comparison: Comparison) -> Comparison:
    print("\n".join(comparison.lines()), flush=True)
    return comparison


def _train(plan: Plan, model_dir: Path) -> TrainOutcome:
    p = plan.profile
    box_s = plan.left() - _MARGIN_S
    if box_s < _TRAIN_MIN_S:
        raise RuntimeError(f"{box_s:.0f} s left of --total-seconds, {_TRAIN_MIN_S:.0f} needed")
    outcome = train_section(
        out=plan.out / "train",
        minutes=p.train_minutes,
        box_s=box_s,
        device=plan.device.type,
        args=p.train_args,
        env=p.train_env,
        start_model=model_dir if p.train_from_check_model else None,
    )
    print("\n".join(outcome.lines()), flush=True)
    return outcome


def _release(plan: Plan) -> None:
    """Give the next section (and the stack's services) the device's memory back."""
    import gc

    gc.collect()
    if plan.device.type == "cuda":
        torch.cuda.empty_cache()


def summary(results: dict[str, Comparison | TrainOutcome | None]) -> list[str]:
    lines = ["", "== summary (ours / baseline)"]
    for name, result in results.items():
        if result is None:
            lines.append(f"{name:<12} FAILED")
        elif isinstance(result, Comparison):
            lines.append(result.summary())
        else:
            lines.append(f"{name:<12} {result.summary()}")
    return lines


def header(plan: Plan) -> str:
    import transformers

    where = "cpu"
    if plan.device.type == "cuda":
        where = f"cuda ({torch.cuda.get_device_name(plan.device)})"
    return (
        f"Temper GPU check, profile {plan.profile.name}: {where}, {dtype_name(plan.dtype)}; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads, "
        f"Python {platform.python_version()}"
    )


# ---------------------------------------------------------------- command line


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--quick", action="store_true", help="the smallest run (CI)")
    parser.add_argument("--layers", type=int, help="model layers (default: the profile's)")
    parser.add_argument("--hidden", type=int, help="hidden size, a multiple of 64")
    parser.add_argument("--seconds", type=float, help="timed seconds per measuring section")
    parser.add_argument("--threads", type=int, help="torch threads (default: the profile's)")
    parser.add_argument("--train-minutes", type=float, help="temper train --minutes")
    parser.add_argument("--total-seconds", type=float, default=570.0, help="the whole run's bound")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated: {','.join(SECTIONS)}"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("run/gpu-check"), help="model, train run and logs"
    )
    return parser.parse_args(argv)


def make_plan(args: argparse.Namespace) -> Plan:
    """The run the options ask for; ``ValueError`` names an option that cannot work."""
    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        raise ValueError("--device cuda: torch sees no CUDA device")
    device = torch.device("cuda" if args.device != "cpu" and cuda else "cpu")
    profile = PROFILES["quick" if args.quick else "gpu" if device.type == "cuda" else "cpu"]
    overrides = {
        "layers": args.layers,
        "hidden": args.hidden,
        "section_s": args.seconds,
        "train_minutes": args.train_minutes,
        "threads": args.threads,
    }
    profile = dataclasses.replace(profile, **{k: v for k, v in overrides.items() if v is not None})
    if profile.hidden < 128 or profile.hidden % 64 or profile.layers < 1:
        raise ValueError("--hidden must be a multiple of 64, at least 128, and --layers >= 1")
    if profile.section_s <= 0 or profile.train_minutes <= 0 or profile.threads < 0:
        raise ValueError("--seconds and --train-minutes must be positive, --threads >= 0")
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown or not sections:
        raise ValueError(f"--sections: unknown {unknown or 'none given'}; known: {SECTIONS}")
    return Plan(
        profile=profile,
        device=device,
        dtype=default_dtype(device),
        sections=sections,
        out=args.out.resolve(),
        deadline=time.monotonic() + args.total_seconds,
    )


def main(argv: Sequence[str] | None = None) -> int:
    from transformers.utils import logging as hf_logging

    from services.runtime import logs

    try:
        plan = make_plan(parse(argv))
    except ValueError as error:
        print(f"gpu_check: {error}", file=sys.stderr)
        return 2
    # Quiet: engine info logs, generation warnings and load progress bars cut the figures.
    logs.configure("gpu-check", level="error")
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    if plan.profile.threads:
        torch.set_num_threads(plan.profile.threads)
    print(header(plan), flush=True)
    plan.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model_dir = build_model(plan.out / "model", plan.profile.layers, plan.profile.hidden)
    print(f"{describe_model(model_dir, plan)}; built in {time.perf_counter() - started:.1f} s")
    results = run_sections(plan, model_dir)
    print("\n".join(summary(results)), flush=True)
    return 0 if all(r is not None and r.ok for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
