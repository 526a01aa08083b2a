"""Loading a causal LM from a Hugging Face directory: one dtype policy for every service.

bf16 on a GPU; float32 on a CPU, where the learner's recomputed log-probabilities then
match the engine's behaviour ones, and where CPUs without native bf16 (AVX512-BF16, AMX)
run it several times slower.  The generator, the learner, the warm-up and the offline
evaluation all load through :func:`load_causal_lm`, so they agree on the dtype by default.
"""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from typing import Any

import torch

#: transformers' from_pretrained is not thread-safe (two engines loading at once in two
#: threads get meta tensors and untied heads): loads are serialized process-wide.
LOAD_LOCK = threading.Lock()

#: The names a setting may give a dtype (empty: the policy's default).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device | str) -> torch.dtype:
    """The policy: bf16 on a GPU, float32 anywhere else."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def parse_dtype(name: str) -> torch.dtype | None:
    """A dtype setting: one of :data:`DTYPES`, or ``""`` for the policy's default (None)."""
    if not name:
        return None
    try:
        return DTYPES[name]
    except KeyError:
        allowed = ", ".join(DTYPES)
        raise ValueError(f"unknown dtype {name!r}: one of {allowed}, or empty") from None


def load_causal_lm(
    model_dir: Path | str, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> Any:
    """The model at ``model_dir`` on ``device``, in ``dtype`` (default: the policy's)."""
    from transformers import AutoModelForCausalLM

    device = torch.device(device)
    with LOAD_LOCK:
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=dtype or default_dtype(device)
        )
    # nn.Module.to: PreTrainedModel.to's decorator confuses type checkers.
    torch.nn.Module.to(model, device)
    return model


def cache_keyword(model: Any) -> str:
    """The keyword ``model.forward`` takes its key/value cache by: transformers 5 renamed
    ``past_key_values`` to ``cache`` (the old name is deprecated)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def load_sequence_scorer(model_dir: Path | str) -> tuple[Any, Any]:
    """A one-label ``AutoModelForSequenceClassification`` and its tokenizer (a learned
    reward), float32 on the CPU, in eval mode; the tokenizer pads (its EOS if it has no
    pad token), and the model finds each sequence's last token through that pad id."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    with LOAD_LOCK:
        tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
        model: Any = AutoModelForSequenceClassification.from_pretrained(
            str(model_dir), num_labels=1, dtype=torch.float32
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return tokenizer, model
