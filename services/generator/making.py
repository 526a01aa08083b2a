"""What a generator is made of: its engine (torch or SGLang, by its settings), its
model's context length, the domains it knows, and the engine's batching figures."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.domains.retry import RetryPolicy
from services.engines.engine import Engine
from services.generator.settings import GeneratorSettings
from services.model.load import parse_dtype


def batching_of(engine: Engine) -> dict[str, float]:
    """How many rows the engine decodes per step, where it batches requests itself."""
    figures = engine.batch_statistics()
    if not figures:  # a server engine (SGLang) batches on its side
        return {}
    return {
        "decode_rows_per_step": figures["rows_per_step"],
        "decode_peak_rows": figures["peak_rows"],
        "prefill_prompts_per_pass": figures["prefill_prompts"] / max(figures["prefill_passes"], 1),
        "time_decode_s": figures["decode_s"],
        "time_prefill_s": figures["prefill_s"],
    }


def context_len(model: Path) -> int:
    config: dict[str, Any] = json.loads((model / "config.json").read_text())
    return int(config.get("max_position_embeddings", 4096))


def known_domains(
    settings: GeneratorSettings,
) -> tuple[Callable[[str], bool] | None, dict[str, float], dict[str, RetryPolicy]]:
    """The check for known domains (None: any goes), their fair-share weights and their
    retry policies."""
    if not settings.check_domains:
        return None, {}, {}
    from services.domains import load_registry

    registry = load_registry(settings.domains_config)
    weights = {domain.name: domain.share_weight for domain in registry}
    retry = {domain.name: domain.retry for domain in registry}
    return registry.__contains__, weights, retry


def make_engine(settings: GeneratorSettings) -> Engine:
    if settings.engine == "torch":
        import torch

        if settings.threads:
            torch.set_num_threads(settings.threads)
        from services.engines.torch.engine import TorchEngine

        return TorchEngine(
            settings.model,
            device=settings.device or None,
            dtype=parse_dtype(settings.dtype),
            cache_bytes=settings.prefix_cache_mb << 20,
            tune_linears=settings.tune_linears,
        )
    from services.engines.sglang.engine import SGLangEngine, SGLangEngineSettings

    engine_settings = SGLangEngineSettings(check_raw_logprobs=settings.sglang_check_raw_logprobs)
    return SGLangEngine(list(settings.sglang_urls), engine_settings)
