"""The torch engine's CPU attention equals transformers' ``sdpa`` on grouped heads."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from services.engines.torch import attention as cpu_attention

HEADS, KV_HEADS, DIM = 6, 2, 16


class Attention(torch.nn.Module):
    """What transformers' attention functions read off a layer."""

    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


def tensors(batch: int, queries: int, keys: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, HEADS, queries, DIM, generator=generator),
        torch.randn(batch, KV_HEADS, keys, DIM, generator=generator),
        torch.randn(batch, KV_HEADS, keys, DIM, generator=generator),
    )


def padding_mask(batch: int, queries: int, keys: int, as_float: bool) -> torch.Tensor:
    """Row b hides its first b columns; causal over the last ``queries`` columns."""
    columns = torch.arange(keys)
    rows = torch.arange(batch).view(-1, 1, 1)
    last = keys - queries + torch.arange(queries).view(1, -1, 1)
    allowed = (columns >= rows) & (columns <= last)
    mask = allowed.unsqueeze(1)
    if as_float:
        return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    return mask


@pytest.mark.parametrize(
    ("queries", "keys", "masked", "as_float"),
    [
        (1, 40, False, False),  # decode step, no padding
        (1, 40, True, False),  # decode step of a padded batch
        (5, 40, True, False),  # new tokens after a cached prefix
        (5, 40, True, True),  # the engine's own additive prefill mask
        (12, 12, False, False),  # a whole prompt: plain causal
    ],
)
def test_equals_transformers_sdpa(queries: int, keys: int, masked: bool, as_float: bool) -> None:
    query, key, value = tensors(3, queries, keys, seed=queries + keys)
    mask = padding_mask(3, queries, keys, as_float) if masked else None
    ours, _ = cpu_attention.grouped_sdpa(Attention(), query, key, value, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(Attention(), query, key, value, mask, scaling=0.25)
    assert ours.shape == theirs.shape == (3, queries, HEADS, DIM)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_registered_under_its_name() -> None:
    from transformers import AttentionInterface

    assert cpu_attention.register() == cpu_attention.ATTENTION
    assert AttentionInterface()[cpu_attention.ATTENTION] is cpu_attention.grouped_sdpa
