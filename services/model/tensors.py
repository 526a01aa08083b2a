"""Tensors that share storage: a tied LM head and its embedding appear under several names
in a state dict, are saved once, and are checked once."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def tied_groups(params: Mapping[str, torch.Tensor]) -> list[list[str]]:
    """Names grouped by the storage (and offset) they share, in state-dict order."""
    groups: dict[tuple[int, int], list[str]] = {}
    for name, tensor in params.items():
        key = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()))
        groups.setdefault(key, []).append(name)
    return list(groups.values())
