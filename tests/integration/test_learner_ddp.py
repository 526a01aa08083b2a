"""A data-parallel learner step under torchrun (two CPU ranks, gloo, loopback), replicated
(``ddp``) or sharded (``fsdp``), equals the single-process step: same parameters within
float rounding, identical on every rank; and a step of a single update, whose logprob
mismatch each rank measures on its own micro-batches, reports on every rank the figures
of one process over the whole batch."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from services.learner.trainer import Trainer
from tests.integration.ddp_step_worker import (
    CONFIG,
    ONE_UPDATE,
    gradients,
    one_update,
    parameters,
    train,
)

REPO = Path(__file__).resolve().parents[2]
RANKS = 2


def _torchrun(model: Path, out: Path, mode: str) -> None:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={RANKS}", "-m", "tests.integration.ddp_step_worker",
        str(model), str(out), mode,
    ]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, f"torchrun failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    print(f"torchrun with {RANKS} ranks took {time.monotonic() - started:.1f}s")


def _close(
    ours: dict[str, torch.Tensor], single: dict[str, torch.Tensor], scale: float, rel: float
) -> None:
    assert ours.keys() == single.keys()
    for name, value in ours.items():
        gap = float((value - single[name]).abs().max())
        assert gap <= rel * scale, f"{name}: {gap:.3g} off the single process ({scale:.3g})"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_take_the_single_process_step(
    mode: str, tiny_model: Path, tmp_path: Path
) -> None:
    _torchrun(tiny_model, tmp_path, mode)
    ranks: list[dict[str, Any]] = [torch.load(tmp_path / f"rank{r}.pt") for r in range(RANKS)]
    for name, value in ranks[1]["params"].items():
        assert torch.equal(value, ranks[0]["params"][name]), f"ranks differ at {name}"
    single = Trainer(tiny_model, tmp_path / "single", CONFIG)
    before = parameters(single)
    losses = train(single, mode)
    after, grads = parameters(single), gradients(single)
    moved = max(float((after[k] - before[k]).abs().max()) for k in after)
    assert moved > 1e-4, "the steps did not move the weights; the comparison proves nothing"
    # Adam divides tiny gradients by tiny moments: their rounding shows most in the weights.
    _close(ranks[0]["params"], after, moved, rel=1e-2)
    _close(ranks[0]["grads"], grads, max(float(g.abs().max()) for g in grads.values()), rel=1e-4)
    assert ranks[0]["losses"] == pytest.approx(losses, rel=1e-4)
    _same_mismatch(ranks, one_update(Trainer(tiny_model, tmp_path / "single-one", ONE_UPDATE)))


def _same_mismatch(ranks: list[dict[str, Any]], single: tuple[float, float, int]) -> None:
    mean, peak, tokens = single
    assert tokens > 0 and peak > mean > 0, "measured tokens with gaps of several sizes"
    for rank, saved in enumerate(ranks):
        assert saved["one_update"] == (
            pytest.approx(mean, rel=1e-5),
            pytest.approx(peak, rel=1e-5),
            tokens,
        ), f"rank {rank}"
