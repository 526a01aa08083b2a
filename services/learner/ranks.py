"""The learner under torchrun: rank 0 is the whole learner service, the others follow it.

Rank 0 alone talks to NATS (batches, commits, publication, heartbeats, statistics) and
alone writes to ``OUT_DIR`` (ledger, checkpoints, weights).  Every other rank runs
:class:`Follower`: no NATS, nothing written.  Rank 0 tells it what to do with
:class:`RankMessage`\\ s, msgspec Structs encoded as MessagePack and broadcast as a byte
tensor on a gloo group of their own (no pickle crosses the boundary):

- ``Sync``, once rank 0 has resumed: every rank loads the optimizer state and position of
  the checkpoint rank 0 names (``OUT_DIR`` must be one directory for every rank, as it
  already is for the generators that load its weights), then takes rank 0's weights.
  Loading beats broadcasting the optimizer state: its tensors exist only after a first
  step, so a follower could not receive them into anything.  A sharded model cannot take
  rank 0's weights by broadcast: its other ranks also load the published weights rank 0
  took after that checkpoint, if any (``weights``), each cutting out its own shards; and
  should rank 0 checkpoint while it resumes, a ``Sync`` goes out before that gather.
- ``Train``: a batch, with rank 0's step and version (exports and lineage move them on
  rank 0 only) and a checksum of its weights; a follower whose weights differ stops the
  job instead of drifting.  Sharded, the checksum is a collective (the shards' sums are
  all-reduced): every rank takes it together after each sync and step, and ``Train``
  carries rank 0's.  Both ranks then take the same trainer step with ``parallel``.
- ``Gather`` (``parallel = "fsdp"`` only): rank 0 exports (or checkpoints, with the
  optimizer state); gathering a sharded model's full state is a collective, so every
  rank joins it and drops what it got.  Only rank 0 writes the files.
- ``Idle``: nothing to train; it keeps a follower's wait within the group's timeout.
- ``Stop``: rank 0's service has stopped; the followers exit 0.

Failure: every collective times out after ``rank_timeout_s``, so no rank waits forever on
a peer that hangs; a rank that dies closes its connections, and torchrun (no restarts)
then stops the others and exits non-zero.  A rank whose torchrun is gone (``kill -9`` of
the launcher) kills itself (:mod:`services.runtime.orphans`).  Whoever runs torchrun
starts it again; the job resumes from the newest checkpoint, and the ledger's leases make
sure no rollout is trained twice or lost.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import torch
import torch.distributed as dist

from protocol.codec import Codec
from protocol.messages import ScoredRollout
from services.learner.distributed import (
    DataParallel,
    ParallelSettings,
    ShardedDataParallel,
    parallel_for,
)
from services.learner.service import LearnerService
from services.learner.settings import LearnerSettings
from services.learner.trainer import Exported, StepResult, Trainer
from services.runtime.logs import get_logger
from services.runtime.orphans import exit_with_parent

_log = get_logger(component="ranks")
_T = TypeVar("_T")


class Sync(msgspec.Struct, tag="sync", frozen=True, kw_only=True):
    #: The checkpoint rank 0 resumed from or saved last; empty when there is none.
    checkpoint: str = ""
    #: Published weights rank 0 took after that checkpoint (read by sharded ranks only).
    weights: str = ""


class Train(msgspec.Struct, tag="train", frozen=True, kw_only=True):
    step: int
    version: int
    #: Sum of rank 0's parameters before the step (float64).
    checksum: float
    items: list[ScoredRollout]


class Gather(msgspec.Struct, tag="gather", frozen=True, kw_only=True):
    #: A checkpoint (model and optimizer state); False: an export (the model).
    optimizer: bool = False


class Idle(msgspec.Struct, tag="idle", frozen=True, kw_only=True):
    pass


class Stop(msgspec.Struct, tag="stop", frozen=True, kw_only=True):
    reason: str = ""


RankMessage = Sync | Train | Gather | Idle | Stop
_MESSAGES: Codec[RankMessage] = Codec(RankMessage)


class OutOfStep(RuntimeError):
    """A follower's weights are not rank 0's: training on would make them drift apart."""

    def __init__(self, rank: int, step: int, ours: float, theirs: float) -> None:
        super().__init__(
            f"rank {rank} is out of step before step {step + 1}: weight checksum "
            f"{ours!r}, rank 0 has {theirs!r}"
        )
        self.rank = rank
        self.step = step


class Channel:
    """Rank 0's messages to every other rank, over a gloo group (CPU tensors, even when the
    gradients travel by NCCL)."""

    def __init__(self, group: Any) -> None:
        self._group = group

    @classmethod
    def open(cls, timeout_s: float) -> Channel:
        return cls(dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)))

    def send(self, message: RankMessage) -> None:
        payload = _MESSAGES.encode(message)
        dist.broadcast(torch.tensor([len(payload)], dtype=torch.int64), src=0, group=self._group)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        dist.broadcast(data, src=0, group=self._group)

    def receive(self) -> RankMessage:
        size = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(size, src=0, group=self._group)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(data, src=0, group=self._group)
        return _MESSAGES.decode(data.numpy().tobytes())


@torch.no_grad()
def checksum(model: torch.nn.Module) -> float:
    """Sum of every parameter in float64: equal on every rank while they are in step (the
    ranks apply bit-identical updates), and cheap next to a step."""
    sums = [p.detach().sum(dtype=torch.float64) for p in model.parameters()]
    return float(torch.stack(sums).sum().item())


def _collective_checksum(parallel: DataParallel, model: torch.nn.Module) -> float | None:
    """Sharded: the checksum every rank takes at the same point; None when replicated (the
    checksum is then local, taken when it is needed)."""
    return parallel.checksum(model) if isinstance(parallel, ShardedDataParallel) else None


class Leader:
    """Rank 0's side, held by the learner service: every call runs in a worker thread."""

    def __init__(self, parallel: DataParallel, channel: Channel, timeout_s: float) -> None:
        self.parallel = parallel
        self._channel = channel
        #: An ``Idle`` goes out when rank 0 has said nothing for this long.
        self._idle_every_s = timeout_s / 4
        self._said_at = time.monotonic()
        # A cancelled idle send may still run in its thread when ``stop`` sends: the lock
        # keeps the broadcasts in order.
        self._sending = threading.Lock()
        #: A step failed part-way (a rank died): the weights may hold part of an update
        #: that no ledger record covers, so they must not be checkpointed.
        self.broken = False
        #: Sharded: the checksum all ranks took after the last sync or step.
        self._checksum: float | None = None
        self._synchronised = False

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    def synchronise(self, trainer: Trainer) -> None:
        """After rank 0 resumed: every rank loads the same checkpoint and rank 0's weights."""
        path, weights = trainer.checkpoint, trainer.weights_from
        self._send(
            Sync(
                checkpoint="" if path is None else str(path.resolve()),
                weights="" if weights is None else str(weights.resolve()),
            )
        )
        self._guarded(lambda: self.parallel.prepare(trainer.model))
        self._checksum = self._guarded(lambda: _collective_checksum(self.parallel, trainer.model))
        self._synchronised = True

    def train(self, trainer: Trainer, items: list[ScoredRollout]) -> StepResult:
        message = Train(
            step=trainer.step,
            version=trainer.version,
            checksum=checksum(trainer.model) if self._checksum is None else self._checksum,
            items=items,
        )
        self._send(message)
        result = self._guarded(lambda: trainer.train(items))
        if self._checksum is not None:
            self._checksum = self._guarded(
                lambda: _collective_checksum(self.parallel, trainer.model)
            )
        return result

    def export(self, trainer: Trainer, keep: int) -> Exported:
        """``trainer.export``; sharded, every rank joins the gather."""
        if not self.parallel.sharded:
            return trainer.export(keep)
        self._gather(trainer, optimizer=False)
        return self._guarded(lambda: trainer.export(keep))

    def save_checkpoint(self, trainer: Trainer, extra: dict[str, Any]) -> Path:
        """``trainer.save_checkpoint``; sharded, every rank joins the gathers."""
        if not self.parallel.sharded:
            return trainer.save_checkpoint(extra)
        self._gather(trainer, optimizer=True)
        return self._guarded(lambda: trainer.save_checkpoint(extra))

    def _gather(self, trainer: Trainer, *, optimizer: bool) -> None:
        if not self._synchronised:
            # Rank 0 checkpoints while it resumes (newer published weights), before the
            # others have loaded anything: their shards must hold the same state first.
            self.synchronise(trainer)
        self._send(Gather(optimizer=optimizer))

    def idle(self) -> None:
        if time.monotonic() - self._said_at >= self._idle_every_s:
            self._send(Idle())

    def stop(self, reason: str) -> None:
        """The followers exit; a rank that is gone already is only logged."""
        try:
            self._send(Stop(reason=reason))
        except Exception as error:  # the job is ending either way; torchrun reports it
            _log.warning("rank_stop_failed", error=repr(error))

    def _send(self, message: RankMessage) -> None:
        with self._sending:
            self._guarded(lambda: self._channel.send(message))
            self._said_at = time.monotonic()

    def _guarded(self, work: Callable[[], _T]) -> _T:
        try:
            return work()
        except Exception:
            self.broken = True
            raise


class Follower:
    """A rank > 0: the trainer step rank 0 asks for, and nothing else."""

    def __init__(self, settings: LearnerSettings, parallel: DataParallel, channel: Channel):
        self.settings = settings
        self.parallel = parallel
        self._channel = channel
        self._log = get_logger(component="follower", rank=parallel.rank)
        self.steps = 0
        #: Sharded: the checksum all ranks took after the last sync or step.
        self._checksum: float | None = None

    def run(self) -> int:
        settings = self.settings
        config = settings.trainer_config()
        trainer = Trainer(settings.model, settings.out_dir, config, settings.device, self.parallel)
        return self.follow(trainer)

    def follow(self, trainer: Trainer) -> int:
        """Take rank 0's messages until it says stop; 0 then."""
        while True:
            message = self._channel.receive()
            if isinstance(message, Stop):
                self._log.info("rank_stopped", reason=message.reason, steps=self.steps)
                return 0
            if isinstance(message, Sync):
                self._sync(trainer, message)
            elif isinstance(message, Train):
                self._train(trainer, message)
            elif isinstance(message, Gather):
                trainer.gather(message.optimizer)

    def _sync(self, trainer: Trainer, message: Sync) -> None:
        if message.checkpoint:
            trainer.load_checkpoint(Path(message.checkpoint))
        if message.weights and self.parallel.sharded:
            trainer.load_weights(
                Path(message.weights), version=trainer.version, step=trainer.step, samples=0
            )
        self.parallel.prepare(trainer.model)
        self._checksum = _collective_checksum(self.parallel, trainer.model)
        self._log.info(
            "rank_synchronised",
            checkpoint=message.checkpoint or None,
            weights=message.weights or None,
        )

    def _train(self, trainer: Trainer, message: Train) -> None:
        ours = checksum(trainer.model) if self._checksum is None else self._checksum
        if ours != message.checksum:
            raise OutOfStep(self.parallel.rank, message.step, ours, message.checksum)
        trainer.step, trainer.version = message.step, message.version
        before = self.parallel.micro_batches
        result = trainer.train(message.items)
        if self._checksum is not None:
            self._checksum = _collective_checksum(self.parallel, trainer.model)
        self.steps += 1
        self._log.info(
            "rank_step",
            step=result.step,
            samples=result.samples,
            micro_batches=self.parallel.micro_batches - before,
            skipped=result.skipped,
        )


def serve(
    settings: LearnerSettings,
    parallel: ParallelSettings,
    run_service: Callable[[LearnerService], int],
) -> int:
    """Run this process's rank: the service on rank 0 (``run_service`` runs it until it
    stops), a follower on the others.  Returns the exit status."""
    exit_with_parent(f"rank {parallel.rank}")
    settings = dataclasses.replace(settings, device=rank_device(settings.device, parallel))
    if settings.threads:
        torch.set_num_threads(settings.threads)
    kind = parallel_for(settings.parallel)
    group = kind.start(parallel, settings.device, settings.rank_timeout_s)
    _log.info(
        "rank_started",
        rank=parallel.rank,
        world_size=parallel.world_size,
        parallel=settings.parallel,
        pid=os.getpid(),
    )
    try:
        channel = Channel.open(settings.rank_timeout_s)
        if parallel.rank == 0:
            return _lead(settings, group, channel, run_service)
        _follow_signals()
        return Follower(settings, group, channel).run()
    finally:
        group.close()


def _lead(
    settings: LearnerSettings,
    group: DataParallel,
    channel: Channel,
    run_service: Callable[[LearnerService], int],
) -> int:
    leader = Leader(group, channel, settings.rank_timeout_s)
    service = LearnerService(settings)
    service.ranks = leader
    code = 1
    try:
        code = run_service(service)
    finally:
        if not leader.broken:
            leader.stop("rank 0 stopped" if code == 0 else f"rank 0 exits {code}")
    return code


def _follow_signals() -> None:
    """torchrun passes SIGTERM (and a terminal SIGINT) to every rank at once.  A follower
    keeps going: rank 0 finishes its step, which needs every rank, then sends ``Stop``;
    should rank 0 be gone instead, the broken connection or torchrun's kill ends it."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _noted)


def _noted(signum: int, _frame: object) -> None:
    _log.info("rank_signal_deferred", signal=signal.Signals(signum).name)


def rank_device(device: str, parallel: ParallelSettings) -> str:
    """A CUDA learner takes its local rank's GPU; a CPU one stays on the CPU."""
    return parallel.device() if torch.device(device).type == "cuda" else device


def torchrun_command(nproc: int) -> list[str]:
    """``temper serve learner --nproc N``: torchrun on this host, N ranks."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", "-m", "services", "serve", "learner",
    ]  # fmt: skip
