"""Sampling of the torch engine: temperature, top-k and top-p over float32 logits, with the
behaviour logprob of each drawn token taken from the raw distribution."""

from __future__ import annotations

import torch

from services.engines.engine import Sampling


def sample_tokens(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, behaviour logprobs) for each row of float32 ``logits`` [batch, vocab].

    The logprob is taken from the raw distribution (temperature 1, unfiltered) whatever
    the sampling parameters: it is what the learner recomputes.
    """
    logprobs = torch.log_softmax(logits, dim=-1)
    if sampling.temperature <= 0:
        tokens = logits.argmax(dim=-1)
    else:
        scores = filter_top_p(
            filter_top_k(logits / sampling.temperature, sampling.top_k), sampling.top_p
        )
        probs = torch.softmax(scores, dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)


def filter_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` best scores of each row (ties at the k-th kept); -1 or 0 keeps all."""
    if k <= 0 or k >= scores.shape[-1]:
        return scores
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < kth, float("-inf"))


def filter_top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of best tokens whose probability reaches ``p`` (at least one)."""
    if p >= 1.0:
        return scores
    ordered, order = torch.sort(scores, dim=-1, descending=True)
    probs = torch.softmax(ordered, dim=-1)
    # A token is dropped when the tokens before it already reach p.
    drop = (probs.cumsum(dim=-1) - probs) >= p
    drop[..., 0] = False
    return scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))


def seeded_generator(device: torch.device, seed: int | None) -> torch.Generator:
    """A per-request generator: the same seed gives the same samples."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
