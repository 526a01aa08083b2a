"""``temper train``'s start policy: a given model directory, or the tiny policy warmed up
once per recipe (model code, domain code, the mix and its weights, warm-up settings) in
the model cache (``$TEMPER_CACHE``) and copied into the run directory from there."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from services.cli.runconfig import BUILTIN, RunDomains, TrainPlan
from services.cli.train_view import say
from services.domains import Domain

if TYPE_CHECKING:
    from services.model.sft import WarmupConfig


def prepare_policy(plan: TrainPlan, domains: RunDomains) -> Path:
    """The start policy; a later run continues from the learner's checkpoint."""
    from services.model.cache import BUILDERS, MODEL_ROOT, cached_model, recipe_key
    from services.model.sft import WarmupConfig

    if plan.model is not None:
        say(f"start policy: {plan.model}")
        return plan.model
    model = plan.run_dir / "model"
    if (model / "config.json").is_file():
        return model
    config = WarmupConfig(
        steps=plan.warmup_steps,
        lr=1e-3,
        examples=4096,
        target_accuracy=plan.warmup_target,
        check_every=10,
        progress=True,
    )
    sources = [*BUILDERS, *(MODEL_ROOT / "domains").rglob("*.py")]
    key = recipe_key([*mix_identity(plan, domains.train), repr(config)], sources)
    start = cached_model(
        "train-start-policy", key, lambda path: _warm_up(plan, domains, config, path)
    )
    if plan.warmup_recovery_steps:
        # A stage of its own on the warmed policy: the plain warm-up stays cached under its
        # key, and these steps only add what a failed call and its fix look like.
        stage = _recovery_config(plan)
        stage_key = recipe_key([key, plan.warmup_recovery_share, repr(stage)], sources)
        start = cached_model(
            "train-start-policy",
            stage_key,
            lambda path: _recover(plan, domains, stage, start, path),
        )
    say(f"start policy: {start} (built once per recipe, copied into {model})")
    model.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(start, model, dirs_exist_ok=True)
    return model


def mix_identity(plan: TrainPlan, mix: Sequence[tuple[Domain, float]]) -> list[object]:
    """What decides the warm-up's examples: each domain, and the weights of a mix.

    A built-in domain is its name (its code is among the recipe's sources); any other is
    its whole declaration, data included.  One built-in domain alone gives the key that
    runs before mixes gave, so their cached start is found again.
    """
    sources = {entry.name: entry.source for entry in plan.domains}
    parts: list[object] = [
        domain.name if sources.get(domain.name) == BUILTIN else _fingerprint(domain)
        for domain, _ in mix
    ]
    if len(mix) > 1:
        parts.append([weight for _, weight in mix])
    return parts


def _fingerprint(domain: Domain) -> str:
    fields = {f.name: getattr(domain, f.name) for f in dataclasses.fields(domain)}
    source = repr(fields.pop("source"))
    # A source without a dataclass repr shows an address, new every run: its type stands in.
    if " at 0x" in source:
        source = type(domain.source).__qualname__
    text = repr(fields) + source
    return f"{domain.name}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _warm_up(plan: TrainPlan, domains: RunDomains, config: WarmupConfig, model: Path) -> None:
    from services.model.sft import supervised_warmup
    from services.model.tiny import init_model

    say(f"building the tiny policy in {model}")
    init_model(model, force=True)
    if not plan.warmup_steps:
        return
    until = (
        f"up to {plan.warmup_steps} steps, until greedy accuracy on train problems "
        f"reaches {plan.warmup_target:.0%}"
        if plan.warmup_target
        else f"{plan.warmup_steps} steps (no accuracy target)"
    )
    say(f"supervised warm-up on the train split of {', '.join(domains.names)}: {until}")
    result = supervised_warmup(model, domains.train, config)
    accuracy = "" if result.train_accuracy is None else f", train {result.train_accuracy:.0%}"
    say(
        f"warm-up done after {result.steps} steps (loss {result.loss:.3f}{accuracy}); "
        "reinforcement learning from here"
    )


def _recovery_config(plan: TrainPlan) -> WarmupConfig:
    from services.model.sft import WarmupConfig

    return WarmupConfig(
        steps=plan.warmup_recovery_steps, lr=1e-3, examples=4096, target_accuracy=0.0, progress=True
    )


def recovery_mix(mix: Sequence[tuple[Domain, float]], share: float) -> list[tuple[Domain, float]]:
    """The mix with ``share`` of each tool domain's references showing a failed call, the
    sandbox's error and the fixed call first; the other domains as they are."""
    from services.domains.tool_use import with_recovery

    return [(with_recovery(domain, share) or domain, weight) for domain, weight in mix]


def _recover(
    plan: TrainPlan, domains: RunDomains, config: WarmupConfig, warmed: Path, model: Path
) -> None:
    from services.model.sft import supervised_warmup

    shutil.copytree(warmed, model)
    say(
        f"recovery warm-up: {config.steps} steps in which {plan.warmup_recovery_share:.0%} of "
        "the tool problems show a failed call, its error and the fixed call"
    )
    result = supervised_warmup(
        model, recovery_mix(domains.train, plan.warmup_recovery_share), config
    )
    say(f"recovery warm-up done after {result.steps} steps (loss {result.loss:.3f})")
