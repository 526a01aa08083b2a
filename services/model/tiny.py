"""``temper model init``: a tiny Qwen2-architecture policy built locally, no download.

The directory is ordinary Hugging Face format (config.json, model.safetensors,
tokenizer.json, a ChatML chat template), so the torch engine, a CPU SGLang server and
the learner all load the same files.  The tokenizer is a byte-level BPE trained here on
a generated corpus, so every byte sequence is encodable and nothing is fetched.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ChatML, as Qwen2 uses it: `<|im_start|>role\ncontent<|im_end|>\n` per message.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN, "<tool_call>", "</tool_call>")
MARKER_FILE = "temper-model.json"


class ModelDirError(ValueError):
    """The target directory cannot be used (exists and is not empty, or not writable)."""


@dataclass(frozen=True, kw_only=True)
class TinyModelSpec:
    """Shape of the tiny policy; defaults train and serve in seconds on one CPU core."""

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    max_positions: int = 4096
    seed: int = 0


def init_model(path: Path, spec: TinyModelSpec | None = None, *, force: bool = False) -> Path:
    """Write a tiny random-initialised Qwen2 policy and its tokenizer to ``path``."""
    spec = spec or TinyModelSpec()
    _prepare_dir(path, force)
    tokenizer = build_tokenizer(spec.vocab_size, spec.seed)
    tokenizer.save_pretrained(str(path))
    _build_model(spec, tokenizer).save_pretrained(str(path), safe_serialization=True)
    marker = {"builder": "temper model init", "spec": spec.__dict__}
    (path / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
    return path


def _prepare_dir(path: Path, force: bool) -> None:
    if path.exists() and not path.is_dir():
        raise ModelDirError(f"{path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise ModelDirError(f"{path} is not empty (pass force=True / --force to overwrite)")
    path.mkdir(parents=True, exist_ok=True)


def build_tokenizer(vocab_size: int, seed: int = 0) -> Any:
    """A byte-level BPE of ``vocab_size`` tokens with the ChatML specials, as a HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


_WORDS = (
    "the a an of to and in is it you that he was for on are with as his they be at one have "
    "this from or had by word but what some we can out other were all there when up use your "
    "how said each she which do their time if will way about many then them write would like "
    "so these her long make thing see him two has look more day could go come did number sound "
    "no most people my over know water than call first who may down side been now find answer "
    "question sum total add plus minus times divided equals result tool call output error value "
    "function return def print import class self for while range list dict true false none "
    "table revenue cost profit year quarter percent growth share price income expense"
).split()


def _corpus(seed: int) -> Iterator[str]:
    """Generated text covering ChatML, arithmetic, prose, code and JSON tool calls."""
    rng = random.Random(seed)
    for _ in range(4000):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16)))
        yield f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n"
        yield f"<|im_start|>assistant\n<answer>{a + b}</answer><|im_end|>\n"
        yield f"{words.capitalize()}. {a} * {b} = {a * b}; {a} - {b} = {a - b}."
        yield f"def f{a}(x):\n    return x + {b}\nprint(f{a}({a}))\n"
        yield f'<tool_call>{{"name": "python", "arguments": {{"code": "print({a})"}}}}</tool_call>'


def _build_model(spec: TinyModelSpec, tokenizer: Any) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab = len(tokenizer)
    convert = tokenizer.convert_tokens_to_ids
    eos, pad = convert(EOS_TOKEN), convert(PAD_TOKEN)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    torch.manual_seed(spec.seed)
    model: Any = Qwen2ForCausalLM(config)
    model = model.to(torch.float32)
    model.generation_config.eos_token_id = [eos]
    model.generation_config.pad_token_id = pad
    return model
