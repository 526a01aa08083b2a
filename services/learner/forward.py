"""The learner's forward pass: log-probabilities and entropy of the trained tokens only.

A multi-turn tool batch is mostly prompt, tool output and padding: one 500-token sample
padded its whole micro-batch to that length.  Each micro-batch here runs only as far as
its own longest row (the trainer cuts them from rows ordered by length), and the output
head runs only on the positions whose next token is trained (its cost grows with the
vocabulary: 150k for Qwen2 tokenizers).  On 2 cores, 128 tool samples with 4 long ones:
8.0 s a step before, 2.5 s after.

A batch is mostly prompt: each task's prompt comes back with every one of its samples.
The rows of one prompt (ordered together, ``Rows.longest_first``) run it once, and their
completions run on its keys and values: ``bench_learner.py``'s 256 arithmetic samples
(45-token prompts, about 9 completion tokens) took 1028 ms a step before, 409 ms after.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from services.learner.rows import Rows
from services.model.load import cache_keyword, default_dtype


@dataclass(frozen=True)
class Trained:
    """Per-token figures ``[B, L]`` aligned with ``rows.mask``; 0 where it is 0."""

    logprobs: torch.Tensor
    #: Entropy of the policy's distribution at each trained position (nats); None when
    #: not asked for.
    entropy: torch.Tensor | None


def trained_logprobs(
    model: Any,
    rows: Rows,
    part: slice | torch.Tensor,
    *,
    entropy: bool = False,
    share_prompts: bool = True,
) -> Trained:
    """The policy's logprob of each trained token of ``rows[part]``, in float32; computed
    in the device's dtype of the policy (bf16 autocast on a GPU).  ``share_prompts``:
    run each distinct prompt once (off: every row whole, as FSDP needs, below)."""
    index = _indices(part, len(rows), rows.tokens.device)
    everywhere = rows.mask[index] > 0
    run = _shared_prompt_pass if share_prompts else _whole_pass
    with _compute_precision(rows.tokens.device):
        hidden, targets, trained = run(model, rows, index, everywhere)
        logits: torch.Tensor = model.get_output_embeddings()(hidden)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    # Both walk the trained tokens row by row, each row's in order: the same order of True.
    assert int(trained.sum()) == int(everywhere.sum()), "a trained token outside a completion"
    spread = _spread(chosen, everywhere)
    if not entropy:
        return Trained(logprobs=spread, entropy=None)
    per_token = -(logprobs.exp() * logprobs).sum(-1)
    return Trained(logprobs=spread, entropy=_spread(per_token, everywhere))


def _shared_prompt_pass(
    model: Any, rows: Rows, index: torch.Tensor, everywhere: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states at the positions that predict a trained token, those tokens, and
    where they sit in the completions ``[R, C]``.

    Each distinct prompt runs once, with its keys and values handed to every row that
    shares it; then each row's completion runs on them.  A group of 8 samples of a
    64-token prompt and 10-token answers costs 144 positions, not 592.
    """
    prompts, owner = torch.unique(rows.prompt[index], return_inverse=True)
    order = torch.arange(len(owner), device=index.device)
    first_row = torch.full_like(prompts, len(owner)).scatter_reduce(0, owner, order, "amin")
    lead = index[first_row]
    prompt_len = rows.prompt_len[index]
    width = int(rows.prompt_len[lead].max())
    # A shorter prompt's row goes on into its completion: only its prompt is shared.
    prompt_mask = (torch.arange(width, device=index.device) < rows.prompt_len[lead, None]).long()
    head = model.base_model(
        input_ids=rows.tokens[lead, :width] * prompt_mask,
        attention_mask=prompt_mask,
        use_cache=True,
    )
    cache = head["cache"] if "cache" in head else head["past_key_values"]  # renamed in 5.x
    cache.batch_select_indices(owner)
    lengths = rows.attention[index].sum(-1)
    tail = int((lengths - prompt_len).max())
    steps = torch.arange(tail, device=index.device)
    at = (prompt_len.unsqueeze(1) + steps).clamp(max=rows.tokens.shape[1] - 1)
    completion = rows.tokens[index].gather(1, at)
    present = steps < (lengths - prompt_len).unsqueeze(1)
    body = model.base_model(
        input_ids=completion * present,
        attention_mask=torch.cat([prompt_mask[owner], present.long()], dim=1),
        position_ids=prompt_len.unsqueeze(1) + steps,
        **{cache_keyword(model.base_model): cache},
    ).last_hidden_state
    last = head.last_hidden_state[owner, prompt_len - 1].unsqueeze(1)
    # The token at completion step j is predicted by the position before it.
    predictors = torch.cat([last, body[:, :-1]], dim=1)
    # ``everywhere`` column c predicts the token at position first + c + 1.
    column = (prompt_len.unsqueeze(1) + steps - 1 - rows.first).clamp(min=0)
    column = column.clamp(max=everywhere.shape[1] - 1)
    trained = everywhere.gather(1, column) & present
    return predictors[trained], completion[trained], trained


def _whole_pass(
    model: Any, rows: Rows, index: torch.Tensor, everywhere: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As :func:`_shared_prompt_pass`, each row whole in one pass of the base model.
    Sharded (FSDP2) training runs this: it is tested against the single process to 1%, and
    the shared prompt sums the same gradient in another order, which Adam's sign-like first
    steps turn into more than that; a layer run twice a step under FSDP2 is not tested."""
    width = int(rows.attention[index].sum(-1).max())
    trained = everywhere[:, : width - 1 - rows.first]
    hidden = model.base_model(
        input_ids=rows.tokens[index, :width], attention_mask=rows.attention[index, :width]
    ).last_hidden_state
    targets = rows.targets(index)[:, : trained.shape[1]]
    return hidden[:, rows.first : -1][trained], targets[trained], trained


def _indices(part: slice | torch.Tensor, size: int, device: torch.device) -> torch.Tensor:
    if isinstance(part, torch.Tensor):
        return part
    return torch.arange(size, device=device)[part]


def _spread(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` (one per True of ``mask``) back in ``mask``'s shape, 0 elsewhere; the
    gradient flows to ``values``."""
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(
        mask, values
    )


def _compute_precision(device: torch.device) -> contextlib.AbstractContextManager[object]:
    dtype = default_dtype(device)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
