"""A weight directory: its safetensors files, their digest, and reading and writing them.

A published directory is written once, in memory (:func:`write_weights`): the digest that
the PolicyUpdate names is taken over those bytes, so it costs no second read.  The start
model's config, tokenizer and template files are linked in beside the weights, so the
directory loads as a Hugging Face model in the torch engine and in SGLang alike.

A weight update is a transaction on the reading side: :func:`read_state_dict` and
:func:`check_state_dict` do everything that can fail without touching the model, and only
then :func:`apply_state_dict` copies the tensors in place (same shapes, checked).

Tied parameters (an LM head sharing the embedding) appear under several names in a state
dict, are saved once (under the first name, as ``save_pretrained`` does) and checked once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save

INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"
#: Files of the start model that a published directory never takes: its own weights.
_WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json", ".bin", ".pt")
_CHUNK = 1 << 20


class DigestMismatch(ValueError):
    def __init__(self, path: Path, expected: str, found: str) -> None:
        super().__init__(f"weights at {path} have digest {found}, the update says {expected}")
        self.path = path
        self.expected = expected
        self.found = found


# ---------------------------------------------------------------- files and digests


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
        raise FileNotFoundError(f"no weight files (*.safetensors) in {path}")
    return files


def directory_digest(path: Path) -> str:
    """``sha256:<hex>`` over the names and bytes of the directory's weight files, in name order."""
    digest = hashlib.sha256()
    for file in weight_files(path):
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def bytes_digest(files: Iterable[tuple[str, bytes]]) -> str:
    """:func:`directory_digest` of files held in memory as ``(name, bytes)``, in name order."""
    digest = hashlib.sha256()
    for name, data in sorted(files, key=lambda item: item[0]):
        digest.update(name.encode() + b"\0")
        digest.update(data)
    return f"sha256:{digest.hexdigest()}"


def verify_digest(path: Path, expected: str) -> None:
    found = directory_digest(path)
    if found != expected:
        raise DigestMismatch(path, expected, found)


# ---------------------------------------------------------------- tied tensors


def tied_groups(params: Mapping[str, torch.Tensor]) -> list[list[str]]:
    """Names grouped by the storage (and offset) they share, in state-dict order."""
    groups: dict[tuple[int, int], list[str]] = {}
    for name, tensor in params.items():
        key = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()))
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def unique_tensors(
    model: torch.nn.Module | Mapping[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The state dict (of ``model``, or ``model`` itself: a gathered one) with each storage
    once, under its first name (safetensors can't save a storage twice)."""
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    return {names[0]: state[names[0]].detach().contiguous() for names in tied_groups(state)}


# ---------------------------------------------------------------- reading


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of the model at ``path``, on the CPU."""
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        state.update(load_file(str(file), device="cpu"))
    return state


def check_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Raise ``ValueError`` naming every unknown, missing or mis-shaped tensor (one name
    of a tied group is enough)."""
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


# ---------------------------------------------------------------- writing


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
