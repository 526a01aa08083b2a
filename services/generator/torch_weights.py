"""Reading a Hugging Face directory's safetensors and swapping them into a live model.

Split in two so that a weight update is a transaction: :func:`read_state_dict` and
:func:`check_state_dict` do everything that can fail without touching the model, and only
then :func:`apply_state_dict` copies the tensors in place (same shapes, checked).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file

from services.model.tensors import tied_groups

INDEX_FILE = "model.safetensors.index.json"


def source_path(source: str) -> Path:
    """``source`` as a local path (a plain path or a ``file://`` URI)."""
    return Path(source.removeprefix("file://"))


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a model directory (sharded or not), or the file itself."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist")
    index = path / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    return files


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of the model at ``path``, on the CPU."""
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        state.update(load_file(str(file), device="cpu"))
    return state


def check_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Raise ``ValueError`` naming every unknown, missing or mis-shaped tensor.

    Tied parameters (the LM head sharing the embedding) appear under several names in
    ``model.state_dict()`` but are saved once: one name of the group is enough.
    """
    params = model.state_dict()
    problems: list[str] = []
    unknown = sorted(set(state) - set(params))
    if unknown:
        problems.append(f"unknown tensors {_few(unknown)}")
    shapes = [
        f"{name} {tuple(state[name].shape)} != {tuple(params[name].shape)}"
        for name in sorted(state)
        if name in params and state[name].shape != params[name].shape
    ]
    if shapes:
        problems.append(f"wrong shapes {_few(shapes)}")
    missing = [names[0] for names in tied_groups(params) if not any(n in state for n in names)]
    if missing:
        problems.append(f"missing tensors {_few(missing)}")
    if problems:
        raise ValueError("; ".join(problems))


def apply_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` into the model's own storage (dtype and device converted)."""
    params = model.state_dict()  # detached tensors sharing the model's storage
    with torch.no_grad():
        for name, tensor in state.items():
            params[name].copy_(tensor)


def _few(names: list[str], limit: int = 5) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
