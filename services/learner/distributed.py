"""Data-parallel learner steps under torchrun: every rank takes the same batch rows,
runs the backward on its share of the micro-batches, and the gradients are summed across
ranks before the clip and the optimizer step, so every rank applies the same update and
the sum equals the single-process gradient (each micro-batch keeps its weight
``mask.sum() / total`` of the whole minibatch).

``DataParallel`` replicates the model (gloo on CPU, nccl on CUDA).  ``ShardedDataParallel``
shards it with ``torch.distributed.fsdp.fully_shard`` for GPU hosts; it is untested here
(no multi-GPU host in the test suite) and is a starting point, not a supported path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from services.learner.loss import LossStats

_Share = TypeVar("_Share")


@dataclass(frozen=True, kw_only=True)
class ParallelSettings:
    """This process's place in the job, as torchrun describes it."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ParallelSettings | None:
        """The settings torchrun exports; None when the process was not started by it."""
        if "WORLD_SIZE" not in environ or "RANK" not in environ:
            return None
        return cls(
            rank=int(environ["RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            local_rank=int(environ.get("LOCAL_RANK", environ["RANK"])),
        )

    def device(self) -> str:
        """One GPU per local rank where there are GPUs, else the CPU."""
        return f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu"


class DataParallel:
    """Replicated model, gradients summed with one all-reduce per parameter."""

    def __init__(self, settings: ParallelSettings, device: str) -> None:
        self.rank = settings.rank
        self.world_size = settings.world_size
        self.device = torch.device(device)
        #: Micro-batches this rank has run the backward on: its part of the work.
        self.micro_batches = 0

    @classmethod
    def start(
        cls, settings: ParallelSettings, device: str, timeout_s: float | None = None
    ) -> DataParallel:
        """Join the process group; MASTER_ADDR and MASTER_PORT come from torchrun
        (``env://``: under torchrun the agent's store already listens on that port).
        ``timeout_s`` bounds every collective, so a rank whose peer hangs fails instead of
        waiting forever (None: torch's default)."""
        backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(torch.device(device))
        timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend, rank=settings.rank, world_size=settings.world_size, timeout=timeout
        )
        return cls(settings, device)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def share(self, items: Sequence[_Share]) -> list[_Share]:
        """This rank's micro-batches: every ``world_size``-th, so shares differ by one at most."""
        mine = list(items[self.rank :: self.world_size])
        self.micro_batches += len(mine)
        return mine

    @torch.no_grad()
    def prepare(self, model: torch.nn.Module) -> None:
        """Start every rank from rank 0's weights, whatever each one loaded."""
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)

    @torch.no_grad()
    def reduce(self, model: torch.nn.Module, stats: list[LossStats]) -> list[LossStats]:
        """Sum the gradients across ranks; the statistics of the whole minibatch."""
        self._sum_gradients([p for p in model.parameters() if p.requires_grad])
        return [self._merge_stats(stats)]

    def _sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        # A parameter no rank reached keeps grad None, as in one process, so AdamW
        # leaves it alone; one that some rank reached gets zeros on the others.
        flags = [p.grad is not None for p in params]
        reached = torch.tensor(flags, dtype=torch.float32, device=self.device)
        dist.all_reduce(reached)
        grads: list[torch.Tensor] = []
        for param, count in zip(params, reached.tolist(), strict=True):
            if count and param.grad is None:
                param.grad = torch.zeros_like(param)
            if param.grad is not None:
                grads.append(param.grad)
        for handle in [dist.all_reduce(g, async_op=True) for g in grads]:
            assert handle is not None
            handle.wait()

    def _merge_stats(self, stats: list[LossStats]) -> LossStats:
        """Token-weighted means over every rank's micro-batches, as one process merges them.
        A NaN on any rank reaches all of them, so they all skip the same update."""
        names = [f.name for f in dataclasses.fields(LossStats) if f.name != "tokens"]
        sums = [sum(getattr(s, name) * s.tokens for s in stats) for name in names]
        values = [*sums, sum(s.tokens for s in stats)]
        totals = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(totals)
        *weighted, tokens = totals.tolist()
        means = {name: value / (tokens or 1) for name, value in zip(names, weighted, strict=True)}
        return LossStats(**means, tokens=int(tokens))


class ShardedDataParallel(DataParallel):
    """FSDP2 (``fully_shard``) for GPU hosts: parameters, gradients and optimizer state
    sharded across ranks.  UNTESTED here: written against the torch API, never run on a
    multi-GPU host.  Known constraints: every rank must run the same number of
    micro-batches (FSDP's all-gathers are collectives), so ``share`` refuses a minibatch
    whose micro-batch count is not a multiple of the world size; the trainer calls the
    base model and the output embeddings separately, so the root module is not wrapped
    and any parameter left outside a wrapped unit (an untied ``lm_head``) is
    all-reduced by hand."""

    @torch.no_grad()
    def prepare(self, model: torch.nn.Module) -> None:
        from torch.distributed.fsdp import fully_shard

        super().prepare(model)
        causal_lm: Any = model  # a transformers model: its decoder is ``base_model``
        base = causal_lm.base_model
        for layer in base.layers:
            fully_shard(layer).set_gradient_divide_factor(1.0)  # a sum, as in DataParallel
        fully_shard(base).set_gradient_divide_factor(1.0)

    def share(self, items: Sequence[_Share]) -> list[_Share]:
        if len(items) % self.world_size:
            raise ValueError(
                f"{len(items)} micro-batches do not split evenly over {self.world_size} "
                "ranks; FSDP needs the same number on every rank"
            )
        return super().share(items)

    @torch.no_grad()
    def reduce(self, model: torch.nn.Module, stats: list[LossStats]) -> list[LossStats]:
        from torch.distributed.tensor import DTensor

        # FSDP reduce-scattered the sharded gradients during backward already.
        plain = [p for p in model.parameters() if p.requires_grad and not isinstance(p, DTensor)]
        self._sum_gradients(plain)
        return [self._merge_stats(stats)]
