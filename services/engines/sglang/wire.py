"""SGLang's native JSON, as this client reads and writes it (SGLang 0.5.23)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from services.engines.engine import EngineError, FinishKind, GenerateRequest, Sampling


class Finish(msgspec.Struct):
    type: str
    message: str | None = None


class Span(msgspec.Struct):
    version: str
    start: int
    end: int


class Meta(msgspec.Struct):
    id: str
    output_token_logprobs: list[tuple[float, int, Any]]
    finish_reason: Finish | None = None
    cached_tokens: int = 0
    prompt_tokens: int = 0
    weight_version: str | None = None
    weight_versions: list[Span] | None = None
    output_token_ids_logprobs: list[list[tuple[float, int, Any]] | None] | None = None


class Output(msgspec.Struct):
    output_ids: list[int]
    meta_info: Meta


class ModelInfo(msgspec.Struct):
    model_path: str
    weight_version: str | None = None


outputs_decoder = msgspec.json.Decoder(list[Output])


model_info_decoder = msgspec.json.Decoder(ModelInfo)


def generate_payload(request: GenerateRequest, rids: Sequence[str]) -> dict[str, Any]:
    n = request.n
    return {
        "input_ids": [list(request.prompt_ids)] * n,
        "sampling_params": [sampling_params(request.sampling, i) for i in range(n)],
        "return_logprob": True,
        "logprob_start_len": -1,
        "rid": list(rids),
    }


def sampling_params(sampling: Sampling, index: int) -> dict[str, Any]:
    params: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "max_new_tokens": sampling.max_new_tokens,
        # Token ids in, token ids out: no text post-processing of the output.
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if sampling.stop_token_ids:
        params["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.seed is not None:
        # One seed per sample: the same seed for all would give n identical samples.
        params["sampling_seed"] = sampling.seed + index
    return params


FINISH: Final[dict[str, FinishKind]] = {"stop": "stop", "length": "length", "abort": "abort"}


def finish_kind(reason: Finish | None) -> FinishKind:
    # No reason, or one this client does not know: the sample did not end normally.
    return FINISH.get(reason.type, "abort") if reason is not None else "abort"


def probed_logprob(out: Output, token: int, url: str) -> float:
    entries = out.meta_info.output_token_ids_logprobs or [None]
    first = entries[0]
    if not first:
        raise EngineError(f"SGLang {url}: no token_ids_logprob in the answer")
    value, probed, _ = first[0]
    if probed != token:
        raise EngineError(f"SGLang {url}: asked the logprob of token {token}, got {probed}")
    return float(value)


def error_detail(body: bytes) -> str:
    text = body.decode(errors="replace").strip()
    with contextlib.suppress(msgspec.DecodeError):
        answer = msgspec.json.decode(body)
        if isinstance(answer, dict):
            for key in ("message", "error", "detail"):
                if key in answer:
                    text = str(answer[key])
                    break
    return text[:500] or "(empty body)"
