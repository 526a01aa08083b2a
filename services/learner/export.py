"""Writing one published weights directory, cheaply enough to do after every step.

The weights are serialized once, in memory: the digest that the PolicyUpdate names is
taken over those bytes, so it costs no second read of the file. The start model's config,
tokenizer and template files are linked in beside them (copied where a link can't be made),
so the directory loads as a Hugging Face model in the torch engine and in SGLang alike.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save

from services.model.tensors import tied_groups
from services.runtime.weights import bytes_digest

WEIGHTS_FILE = "model.safetensors"
#: Files of the start model that a published directory never takes: its own weights.
_WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json", ".bin", ".pt")


def unique_tensors(
    model: torch.nn.Module | Mapping[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The state dict (of ``model``, or ``model`` itself: a gathered one) with each storage
    once, under its first name.

    Tied parameters (an LM head sharing the embedding) can't be saved twice in
    safetensors; keeping the first name, the embedding's, is what ``save_pretrained`` does.
    """
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    return {names[0]: state[names[0]].detach().contiguous() for names in tied_groups(state)}


def write_weights(
    model: torch.nn.Module | Mapping[str, torch.Tensor],
    config_json: str,
    source: Path,
    target: Path,
) -> str:
    """Write ``model`` (or a state dict) into the new directory ``target``; return its digest."""
    target.mkdir(parents=True)
    data = save(unique_tensors(model), metadata={"format": "pt"})
    (target / WEIGHTS_FILE).write_bytes(data)
    (target / "config.json").write_text(config_json)
    for extra in source.iterdir():
        if extra.is_file() and extra.name != "config.json" and not _is_weights(extra.name):
            _link_or_copy(extra, target / extra.name)
    return bytes_digest([(WEIGHTS_FILE, data)])


def _is_weights(name: str) -> bool:
    return name.endswith(_WEIGHT_SUFFIXES)


def _link_or_copy(source: Path, target: Path) -> None:
    # The start model's files never change during a run; a hard link costs no bytes.
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
