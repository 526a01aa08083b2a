"""Data-parallel learner steps under torchrun: every rank takes the same batch rows,
runs the backward on its share of the micro-batches, and the gradients are summed across
ranks before the clip and the optimizer step, so every rank applies the same update and
the sum equals the single-process gradient (each micro-batch keeps its weight
``mask.sum() / total`` of the whole minibatch).

``DataParallel`` replicates the model (gloo on CPU, nccl on CUDA).  ``ShardedDataParallel``
shards it with ``torch.distributed.fsdp.fully_shard``; the learner setting ``parallel``
(``ddp`` or ``fsdp``) picks one under torchrun.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar, get_args

import torch
import torch.distributed as dist

from services.learner.loss import LossStats
from services.learner.mismatch import NOT_MEASURED, Mismatch

_Share = TypeVar("_Share")

#: The learner's ``parallel`` setting: how the ranks hold the model.
ParallelMode = Literal["ddp", "fsdp"]
PARALLEL_MODES: tuple[str, ...] = get_args(ParallelMode)


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

    #: Whether the full state must be gathered (a collective every rank joins) to be read.
    sharded = False

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

    def clip(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        """Clip the summed gradients to ``max_norm``; their norm before."""
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def full_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's whole state dict (on rank 0 at least)."""
        return model.state_dict()

    def full_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        """The optimizer's state dict as one process would save it (on rank 0 at least)."""
        return optimizer.state_dict()

    def load(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        state: dict[str, torch.Tensor],
        optimizer_state: dict[str, Any] | None,
    ) -> None:
        """Take a full state that every rank read from the same file (no collective)."""
        model.load_state_dict(state)
        if optimizer is not None and optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)

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

    @torch.no_grad()
    def reduce_mismatch(self, mine: Mismatch) -> Mismatch:
        """The logprob mismatch over every rank's micro-batches, from this rank's: a
        collective every rank joins, with nothing measured as well."""
        sums = torch.tensor([mine.mean * mine.tokens, mine.tokens], dtype=torch.float64)
        peak = torch.tensor([mine.max], dtype=torch.float64)
        sums, peak = sums.to(self.device), peak.to(self.device)
        dist.all_reduce(sums)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        total, tokens = sums.tolist()
        if not tokens:
            return NOT_MEASURED
        return Mismatch(mean=total / tokens, max=float(peak.item()), tokens=int(tokens))


class ShardedDataParallel(DataParallel):
    """FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded across
    ranks.  Tested on CPU with gloo (two ranks: a step equals the single-process step; the
    service exports, checkpoints and resumes); never run on GPUs with NCCL here.

    Constraints: every rank must run the same number of micro-batches (FSDP's
    all-gathers are collectives): the trainer splits a minibatch into a multiple of the
    world size, and ``share`` refuses one that could not be (fewer rows than ranks).
    The trainer calls the base model and the output embeddings separately, so the root
    module is not wrapped: the decoder layers and the base model are, and the output
    embeddings' parameters (tied to the input embeddings, or an untied ``lm_head``) stay
    replicated, their gradients all-reduced by hand.  Reading the full state (exports,
    checkpoints) is a collective: every rank calls ``full_state`` at the same time, and
    rank 0 alone gets the tensors."""

    sharded = True

    def __init__(self, settings: ParallelSettings, device: str) -> None:
        super().__init__(settings, device)
        self._sharded_models: set[int] = set()

    @torch.no_grad()
    def prepare(self, model: torch.nn.Module) -> None:
        """Shard once, from rank 0's weights; a second call (after a resume, which loaded
        the same files on every rank) has nothing to do."""
        from torch.distributed.fsdp import fully_shard

        if id(model) in self._sharded_models:
            return
        super().prepare(model)
        causal_lm: Any = model  # a transformers model: its decoder is ``base_model``
        base = causal_lm.base_model
        # Tied embeddings are used outside the base model's forward: they stay whole.
        replicated = set(causal_lm.get_output_embeddings().parameters())
        for layer in base.layers:
            _summing(fully_shard(layer))
        _summing(fully_shard(base, ignored_params=replicated))
        self._sharded_models.add(id(model))

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

    @torch.no_grad()
    def clip(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        """``clip_grad_norm_`` over sharded and replicated gradients together (torch's
        refuses the mix): the norm of the whole gradient, the same on every rank."""
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in model.parameters() if p.grad is not None]
        shards = torch.zeros(1, dtype=torch.float32, device=self.device)
        whole = torch.zeros(1, dtype=torch.float32, device=self.device)
        for grad in grads:
            if isinstance(grad, DTensor):
                shards += grad.to_local().pow(2).sum()
            else:
                whole += grad.pow(2).sum()
        dist.all_reduce(shards)
        norm = (shards + whole).sqrt()
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for grad in grads:
            (grad.to_local() if isinstance(grad, DTensor) else grad).mul_(scale)
        return norm[0]

    def full_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """A collective: rank 0 gets the whole state dict on the CPU, the others nothing."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        full: dict[str, Any] = get_model_state_dict(model, options=_full())
        # Names of one parameter (tied embeddings) share one tensor, as in
        # ``model.state_dict()``, so that an export writes it once.
        first: dict[int, str] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            known = first.setdefault(id(param), name)
            if known != name and known in full:
                full[name] = full[known]
        return full

    def full_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        """A collective: rank 0 gets the optimizer state keyed as ``optimizer.state_dict``
        keys it (parameter positions), so that a checkpoint loads in one process too."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        full: Any = get_optimizer_state_dict(model, optimizer, options=_full())
        if not full:
            return {}
        names = [name for group in full["param_groups"] for name in group["params"]]
        position = {name: index for index, name in enumerate(names)}
        groups = [
            {**group, "params": [position[name] for name in group["params"]]}
            for group in full["param_groups"]
        ]
        state = {position[name]: value for name, value in full["state"].items()}
        return {"state": state, "param_groups": groups}

    @torch.no_grad()
    def load(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        state: dict[str, torch.Tensor],
        optimizer_state: dict[str, Any] | None,
    ) -> None:
        """Every rank read the same full state: each cuts its own shards out of it, with
        no collective, so rank 0 can resume before the others are told to."""
        sharded = model.state_dict()
        model.load_state_dict({name: _like(sharded[name], value) for name, value in state.items()})
        if optimizer is None or optimizer_state is None:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        per_param = {
            index: {key: _like(params[index], value) for key, value in entries.items()}
            for index, entries in optimizer_state["state"].items()
        }
        optimizer.load_state_dict({**optimizer_state, "state": per_param})

    @torch.no_grad()
    def checksum(self, model: torch.nn.Module) -> float:
        """A collective: the sum of the full model (each rank's shards, summed across
        ranks, plus the replicated parameters as this rank holds them).  Ranks compare it
        for the replicated parameters; the shards' part is the same on every rank."""
        from torch.distributed.tensor import DTensor

        shards = torch.zeros(1, dtype=torch.float64, device=self.device)
        whole = torch.zeros(1, dtype=torch.float64, device=self.device)
        for param in model.parameters():
            if isinstance(param, DTensor):
                shards += param.to_local().detach().sum(dtype=torch.float64)
            else:
                whole += param.detach().sum(dtype=torch.float64)
        dist.all_reduce(shards)
        return float((shards + whole).item())


def _summing(unit: Any) -> None:
    """Gradients summed across ranks, as in DataParallel.  Plain SUM reductions: gloo has
    no PREMUL_SUM, which FSDP would use for a divide factor of its own."""
    unit.set_gradient_divide_factor(1.0)
    unit.set_force_sum_reduction_for_comms(True)


def _like(target: Any, value: Any) -> Any:
    """``value`` (a full tensor) as ``target`` holds it: this rank's shard of a DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(target, DTensor) or not isinstance(value, torch.Tensor):
        return value
    if value.shape != target.shape:
        return value  # a scalar such as Adam's step
    full = value.to(target.device)
    # ``src_data_rank=None``: every rank holds the full tensor already; no broadcast.
    return distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)


def parallel_for(mode: str) -> type[DataParallel]:
    """The class behind the learner's ``parallel`` setting."""
    if mode == "ddp":
        return DataParallel
    if mode == "fsdp":
        return ShardedDataParallel
    raise ValueError(f"parallel {mode!r} is not one of {', '.join(PARALLEL_MODES)}")


def _full() -> Any:
    """Gathered whole, onto rank 0's CPU: what an export or a checkpoint writes.  Imported
    here, not at the top: torch.distributed.checkpoint takes about a second to import, and
    only a sharded learner needs it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)
