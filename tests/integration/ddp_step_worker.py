"""One rank of the data-parallel learner test: run under torchrun, train the fixed batch
for a few steps, and save this rank's parameters and step losses (the full ones, sharded);
then train a fresh copy of the model one step of a single update, and save the logprob
mismatch that step reports.

    torchrun --standalone --nproc-per-node 2 -m tests.integration.ddp_step_worker MODEL OUT MODE

MODE is the learner's ``parallel`` setting: ``ddp`` or ``fsdp``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from protocol.messages import ChatMessage, Rollout, ScoredRollout, ScoreStatus, Segment, Task
from protocol.packed import pack_f32, pack_i32, pack_u8
from services.learner.distributed import ParallelSettings, parallel_for
from services.learner.trainer import Trainer, TrainerConfig

PROMPT = [1, 341, 203, 317, 309, 2, 203, 1, 347, 203]
STEPS = 2
#: Two minibatches of six rows, three micro-batches each: the ranks' shares are unequal
#: (two and one), and so are the micro-batches' token counts.  The clip is out of reach:
#: clipping (and Adam) would hide a gradient off by a constant factor, such as a mean
#: over the ranks instead of a sum; the test compares the gradients too.
CONFIG = TrainerConfig(lr=1e-3, micro_batch=2, minibatches=2, grad_clip=1e6)
#: One update per batch: no proximal pass, so each rank measures the logprob mismatch on
#: its own micro-batches only and the step's figures are their reduction across ranks.
ONE_UPDATE = TrainerConfig(lr=1e-3, micro_batch=2, minibatches=1, epochs=1, grad_clip=1e6)
#: Five micro-batches of unequal token counts: three on rank 0 and two on rank 1 under
#: DDP (FSDP splits them into six), so a mean over ranks that is not weighted by their
#: tokens, or a max that is not the largest, reads differently from one process.
ONE_UPDATE_ROWS = 10


def batch() -> list[ScoredRollout]:
    """Six groups of two with completions of different lengths and rewards."""
    return [
        _item(f"g{group}", index, [22 + group + k for k in range(1 + group % 3 + index)])
        for group in range(6)
        for index in (0, 1)
    ]


def _item(task_id: str, index: int, completion: list[int]) -> ScoredRollout:
    task = Task(id=task_id, domain="ddp", prompt=[ChatMessage(role="user", content="q")], n=2)
    rollout = Rollout(
        id=f"{task_id}/{index}",
        task=task,
        sample_index=index,
        tokens=pack_i32(PROMPT + completion),
        prompt_len=len(PROMPT),
        logprobs=pack_f32([-7.0 - 0.1 * k for k in range(len(completion))]),
        loss_mask=pack_u8([1] * len(completion)),
        segments=[Segment(start=0, end=len(completion), version=0)],
    )
    reward = float(index == int(task_id[1:]) % 2)
    return ScoredRollout(id=rollout.id, rollout=rollout, reward=reward, status=ScoreStatus.SCORED)


def train(trainer: Trainer, mode: str = "ddp") -> list[float]:
    """The loss of each step.  DDP: the last one has a single micro-batch, so rank 1 has
    no share and its gradients come from rank 0 alone.  FSDP needs as many micro-batches
    on every rank: the trainer splits three into four (of one and two rows), and the last
    step's single one (two rows a minibatch) into two of one row."""
    steps = [batch()] * STEPS + [batch()[: 2 if mode == "ddp" else 4]]
    return [trainer.train(items).loss.loss for items in steps]


def one_update(trainer: Trainer) -> tuple[float, float, int]:
    """The logprob mismatch (mean, max, tokens) of one single-update step."""
    result = trainer.train(batch()[:ONE_UPDATE_ROWS])
    assert result.updates == 1
    return result.logprob_mismatch, result.logprob_mismatch_max, result.logprob_mismatch_tokens


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered (a collective); a replicated one as it is."""
    whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return whole.detach().clone()


def parameters(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: _whole(v) for k, v in trainer.model.state_dict().items()}


def gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The last update's gradients (the next update clears them)."""
    named = trainer.model.named_parameters()
    return {k: _whole(p.grad) for k, p in named if p.grad is not None}


def main(model: Path, out: Path, mode: str) -> None:
    settings = ParallelSettings.from_env(os.environ)
    assert settings is not None, "run me under torchrun"
    parallel = parallel_for(mode).start(settings, "cpu")
    try:
        run = out / f"run{settings.rank}"
        trainer = Trainer(model, run, CONFIG, parallel=parallel)
        losses = train(trainer, mode)
        state = {"params": parameters(trainer), "grads": gradients(trainer), "losses": losses}
        fresh = Trainer(model, out / f"one{settings.rank}", ONE_UPDATE, parallel=parallel)
        state["one_update"] = one_update(fresh)
        torch.save(state, out / f"rank{settings.rank}.pt")
    finally:
        parallel.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
