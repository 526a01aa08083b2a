"""Token in, token out across tool turns, and the learner's agreement with what was sampled.

Multi-turn trajectories of the ``tool_use`` domain come from the real agent loop, with
every ``python`` tool call run in the real sandbox service (Docker), on each engine in
float32: the embedded torch engine and the real CPU SGLang server.  The policy is the tiny
model after the short supervised warm-up on tool_use's reference answers (``tool_policy``):
a random one never writes a tool call.  For every rollout:

- the engine was fed, turn after turn, exactly the trajectory so far: the first turn the
  rendered prompt, each later turn the previous turn's prompt, plus what the engine
  returned, plus the tool observation encoded on its own.  Nothing earlier is re-tokenized,
  and the rollout is the last prompt plus the last output;
- the loss mask is 1 exactly on the tokens the engine sampled, 0 on tool output (the
  prompt carries none), and the behaviour logprobs are the engine's, 0 where the mask is 0;
- the learner, on the same weights at the samples' version, recomputes the logprobs of
  the sampled tokens within the engine's float32 numerics (``logprob_mismatch``).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from nats.aio.client import Client as NATS

from protocol.messages import Rollout, RolloutStatus, ScoredRollout, ScoreStatus, Task
from protocol.packed import unpack_u8
from services.domains import load_registry
from services.engines.engine import Engine, EngineStatistics, GenerateRequest, Sample
from services.engines.sglang.engine import SGLangEngine
from services.engines.sglang.server import SGLangServer
from services.engines.torch.engine import TorchEngine
from services.generator.agent import AgentLoop
from services.generator.tools import SandboxTools
from services.learner.trainer import StepResult, Trainer, TrainerConfig
from services.model.tokens import ChatTokenizer
from services.runtime.settings import RuntimeSettings
from services.sandbox.service import SandboxService
from services.sandbox.settings import Limits, SandboxSettings
from tests.integration.support import client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: Tasks and samples per task: a few groups of two, on two cores.
#: Six tasks of two samples: the warmed policy calls a tool in a few of them (two are needed).
TASKS = 6
SAMPLES = 2
#: Room for the warmed policy's tool call to reach its closing tag (the turn's stop).
MAX_TOKENS = 80
MAX_TURNS = 3
#: The issue's bound, for both engines in float32; both measured far inside it on these
#: trajectories (torch: mean 5e-7, max 5e-6; the CPU SGLang server, whose kernels are its
#: own: mean 4e-7, max 5e-6), while one re-tokenized turn showed as a mean of 3e-2 and a
#: max of 4 nats.  The watch's own sglang/float32 threshold (2e-2) is looser: it judges
#: runs of any model and any length, not these short ones.
BOUND = 1e-3


# ---------------------------------------------------------------- the recording delegate


@dataclass(kw_only=True)
class Call:
    """One request as the engine got it, and the samples it returned (those not yet
    matched to a rollout's turn)."""

    prompt: list[int]
    samples: list[Sample]


class RecordingEngine:
    """Records and forwards: each request reaches the wrapped engine unchanged and its
    samples come back unchanged.  It fakes nothing; the record is what a test reads."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.name = engine.name
        self.calls: list[Call] = []

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        samples = await self.engine.generate(request)
        self.calls.append(Call(prompt=list(request.prompt_ids), samples=list(samples)))
        return samples

    async def load_weights(self, version: int, source: str) -> None:
        await self.engine.load_weights(version, source)

    async def healthy(self) -> bool:
        return await self.engine.healthy()

    def statistics(self) -> EngineStatistics:
        return self.engine.statistics()

    def batch_statistics(self) -> dict[str, float]:
        return self.engine.batch_statistics()

    def take(self, prompt: list[int], output: list[int]) -> Sample:
        """The sample the engine returned for ``output`` when fed exactly ``prompt``,
        removed from the record (each sample makes one turn of one rollout)."""
        for call in self.calls:
            if call.prompt != prompt:
                continue
            for sample in call.samples:
                if sample.output_ids == output:
                    call.samples.remove(sample)
                    return sample
        raise AssertionError(self._nearest(prompt, output))

    def left(self) -> list[Sample]:
        return [sample for call in self.calls for sample in call.samples]

    def _nearest(self, prompt: list[int], output: list[int]) -> str:
        """Where the trajectory parts from the closest prompt the engine was fed."""
        fed = [call.prompt for call in self.calls]
        best = max(fed, key=lambda ids: _common(ids, prompt), default=[])
        at = _common(best, prompt)
        return (
            f"the engine was never fed this turn's {len(prompt)} tokens then returned its "
            f"{len(output)}: the closest of {len(fed)} prompts ({len(best)} tokens) parts at "
            f"token {at}: fed {best[at : at + 8]}, trajectory {prompt[at : at + 8]}"
        )


def _common(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


# ---------------------------------------------------------------- generating


def _tasks() -> list[Task]:
    tasks = load_registry(None).get("tool_use").make_tasks(TASKS, "eval", 0)
    return [
        msgspec.structs.replace(
            task,
            sampling=msgspec.structs.replace(
                task.sampling, temperature=1.0, max_tokens=MAX_TOKENS, seed=17 * i
            ),
            n=SAMPLES,
            max_turns=MAX_TURNS,
        )
        for i, task in enumerate(tasks)
    ]


@asynccontextmanager
async def _sandbox(nats_url: str, image: str, tmp_path: Path) -> AsyncIterator[NATS]:
    settings = SandboxSettings(
        runtime=RuntimeSettings(nats_url=nats_url, instance="identity-sandbox", grace_s=5),
        backend="docker",
        image=image,
        pool_size=SAMPLES,
        # AF_UNIX paths are short: keep the sockets out of pytest's long tmp paths.
        state_dir=Path(tempfile.mkdtemp(prefix="tti-")),
        snapshot_dir=tmp_path / "snapshots",
        defaults=Limits(timeout_s=10.0, memory_mb=128, pids=64, output_bytes=4096, disk_mb=16),
    )
    async with SandboxService(settings), client(nats_url) as nc:
        yield nc


async def _rollouts(
    engine: RecordingEngine, tokenizer: ChatTokenizer, nats_url: str, image: str, tmp_path: Path
) -> list[Rollout]:
    async with _sandbox(nats_url, image, tmp_path) as nc:
        loop = AgentLoop(engine, tokenizer, SandboxTools(nc, timeout_s=30))
        groups = await asyncio.gather(*(loop.run(task) for task in _tasks()))
    rollouts = [rollout for group in groups for rollout in group]
    for rollout in rollouts:
        assert rollout.status is RolloutStatus.OK, rollout.error
    multi_turn = [r for r in rollouts if _kinds(r).count("gen") >= 2 and "tool" in _kinds(r)]
    assert len(multi_turn) >= 2, [_kinds(r) for r in rollouts]
    return rollouts


def _kinds(rollout: Rollout) -> list[str]:
    return [segment.kind for segment in rollout.segments]


# ---------------------------------------------------------------- the checks


def _assert_token_in_token_out(
    rollouts: list[Rollout], record: RecordingEngine, tokenizer: ChatTokenizer
) -> None:
    for rollout in rollouts:
        ids = rollout.token_ids.tolist()
        start = rollout.prompt_len
        fed = tokenizer.render(rollout.task.prompt)
        assert ids[:start] == fed, "the prompt is the chat template's rendering"
        observations = iter(rollout.tool_calls)
        for segment in rollout.segments:
            part = ids[start + segment.start : start + segment.end]
            if segment.kind == "tool":
                # Encoded on its own from the tool's output and appended.
                observation = tokenizer.encode(tokenizer.observation(next(observations).output))
                assert part == observation, f"{rollout.id}: the tool turn is its output's tokens"
                fed = fed + observation
                continue
            sample = record.take(fed, part)
            behaviour = rollout.behaviour_logprobs[segment.start : segment.end]
            np.testing.assert_array_equal(behaviour, np.asarray(sample.logprobs, dtype=np.float32))
            assert segment.version == sample.version
            fed = fed + sample.output_ids
        assert next(observations, None) is None, "one observation per tool call"
        assert ids == fed, f"{rollout.id}: the rollout is the last prompt plus what followed"
    assert record.left() == [], "every sample the engine returned is a turn of a rollout"


def _assert_masks(rollouts: list[Rollout]) -> None:
    for rollout in rollouts:
        completion = len(rollout.token_ids) - rollout.prompt_len
        mask = unpack_u8(rollout.loss_mask).astype(int)
        assert len(mask) == completion, "the prompt carries no mask: it is never trained"
        sampled = np.zeros(completion, dtype=int)
        covered = 0
        for segment in rollout.segments:
            assert segment.start == covered, f"{rollout.id}: segments tile the completion"
            covered = segment.end
            sampled[segment.start : segment.end] = segment.kind == "gen"
        assert covered == completion
        np.testing.assert_array_equal(mask, sampled)
        assert not rollout.behaviour_logprobs[mask == 0].any(), "tool output carries logprob 0"
        assert (rollout.behaviour_logprobs[mask == 1] < 0).all()


def _learner_step(rollouts: list[Rollout], policy: Path, version: int, out: Path) -> StepResult:
    """One step of a learner holding ``policy`` as ``version``; each group's samples get
    distinct rewards so that every sample has an advantage and is trained on."""
    trainer = Trainer(policy, out, TrainerConfig(lr=1e-4, micro_batch=4))
    if version:
        trainer.load_weights(policy, version=version, step=0, samples=0)
    scored = [
        ScoredRollout(id=r.id, rollout=r, reward=float(r.sample_index), status=ScoreStatus.SCORED)
        for r in rollouts
    ]
    return trainer.train(scored)


def _assert_learner_agrees(rollouts: list[Rollout], result: StepResult, engine: str) -> None:
    trained = sum(int(unpack_u8(r.loss_mask).sum()) for r in rollouts)
    assert result.trained == len(rollouts) and result.refused == []
    assert result.logprob_mismatch_tokens == trained > 0, "every sampled token is measured"
    found = f"mean {result.logprob_mismatch:.2e}, max {result.logprob_mismatch_max:.2e}"
    print(f"{engine}/float32 logprob_mismatch over {trained} tokens: {found}")
    assert result.logprob_mismatch < BOUND and result.logprob_mismatch_max < BOUND, found
    assert (result.engine, result.dtype) == (engine, "float32")


# ---------------------------------------------------------------- the engines


async def test_torch_engine_trajectories_are_token_identical_and_the_learner_agrees(
    nats_url: str, tool_policy: Path, sandbox_image: str, tmp_path: Path
) -> None:
    tokenizer = ChatTokenizer.load(tool_policy)
    record = RecordingEngine(engine=TorchEngine(tool_policy, dtype=torch.float32))
    await record.start()
    try:
        rollouts = await _rollouts(record, tokenizer, nats_url, sandbox_image, tmp_path)
    finally:
        await record.close()
    _assert_token_in_token_out(rollouts, record, tokenizer)
    _assert_masks(rollouts)
    result = _learner_step(rollouts, tool_policy, 0, tmp_path / "learner")
    _assert_learner_agrees(rollouts, result, "torch")


async def test_sglang_trajectories_are_token_identical_and_the_learner_agrees(
    nats_url: str,
    sglang_server: SGLangServer,
    tiny_model: Path,
    tool_policy: Path,
    sandbox_image: str,
    tmp_path: Path,
) -> None:
    tokenizer = ChatTokenizer.load(tool_policy)
    async with _serving(sglang_server, tool_policy, restore=tiny_model) as (engine, version):
        record = RecordingEngine(engine=engine)
        rollouts = await _rollouts(record, tokenizer, nats_url, sandbox_image, tmp_path)
    assert {r.policy_version for r in rollouts} == {version}
    _assert_token_in_token_out(rollouts, record, tokenizer)
    _assert_masks(rollouts)
    result = _learner_step(rollouts, tool_policy, version, tmp_path / "learner")
    _assert_learner_agrees(rollouts, result, "sglang")


@asynccontextmanager
async def _serving(
    server: SGLangServer, policy: Path, *, restore: Path
) -> AsyncIterator[tuple[SGLangEngine, int]]:
    """``policy`` on the session's server as a new version for the block, then ``restore``
    (the model the other tests expect there)."""
    async with SGLangEngine([server.url]) as engine:
        version = engine.server_version(server.url) + 1
        await engine.load_weights(version, str(policy))
        try:
            yield engine, version
        finally:
            await engine.load_weights(version + 1, str(restore))
