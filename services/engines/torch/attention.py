"""Attention of the torch engine on CPUs: SDPA over the KV heads, never over copies.

Models with grouped-query attention (Qwen2: 14 query heads over 2 KV heads in 0.5B)
keep fewer KV heads than query heads.  transformers' ``sdpa`` attention reaches that
in one of two ways, each the slow one on a CPU where it is taken:

- with a mask (a prompt after a cached prefix, a padded batch), it repeats every KV
  head to its query heads (a copy of the whole KV per layer per pass) and runs plain
  SDPA: measured here, a 100-token prompt after 1,000 cached tokens spends about twice
  the attention time of SDPA's own grouped-query mode (``enable_gqa``), which on a CPU
  takes a mask as well;
- without a mask (a decode step of an unpadded batch), it uses ``enable_gqa``, which
  for one query per row is 2-3x slower here than folding each KV head's query heads
  into the query axis (what transformers itself does for one token with a mask).

This implementation (registered as ``ATTENTION``) takes the faster form in each case:
one new token per row, the query heads folded onto their KV head; more, SDPA's
``enable_gqa`` with the mask.  The masks are transformers' own for ``sdpa``.  Models
without grouped heads, or with features this does not handle (a position bias, soft
capping, dropout), go to transformers' ``sdpa`` as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

#: The name models are switched to (``model.set_attn_implementation``).
ATTENTION = "temper_cpu_sdpa"


def register() -> str:
    """Make ``ATTENTION`` known to transformers (idempotent); its name."""
    AttentionInterface.register(ATTENTION, grouped_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION


def grouped_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``[batch, heads, queries, dim]`` in; ``([batch, queries, heads, dim], None)`` out,
    as transformers' attention functions."""
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    if not _handled(query, key, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    if queries == 1:
        folded = query.reshape(batch, kv_heads, heads // kv_heads, dim)
        out = functional.scaled_dot_product_attention(
            folded, key, value, attn_mask=attention_mask, scale=scaling
        ).reshape(batch, heads, 1, dim)
    else:
        # No mask: transformers left it out because plain causal attention is exact here.
        causal = attention_mask is None and (is_causal is None or is_causal)
        out = functional.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            scale=scaling,
            is_causal=causal,
            enable_gqa=True,
        )
    return out.transpose(1, 2).contiguous(), None


def _handled(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    dropout: float,
    extra: dict[str, Any],
) -> bool:
    """Grouped heads, a 4-D mask or none, and nothing this does not implement."""
    if key.shape[1] == query.shape[1] or dropout:
        return False
    if extra.get("position_bias") is not None or extra.get("softcap"):
        return False
    if mask is None:
        # Causal and square, or one query: transformers crops the keys otherwise.
        return query.shape[2] in (1, key.shape[2])
    return mask.ndim == 4
