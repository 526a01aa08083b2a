"""The agent loop, token in and token out.

Each sample is a :class:`~services.generator.trajectory.Trajectory` of token ids.
Nothing already in it is ever re-tokenized, so what the learner trains on is exactly
what the policy saw and produced.  A failure says what failed (``Rollout.failure``):
the tools, the engine, or a turn's time limit; retries and quarantine go by it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from protocol.messages import (
    FailureKind,
    FinishReason,
    Rollout,
    RolloutStatus,
    SavedTrajectory,
    Task,
    Timings,
    ToolCall,
    rollout_id,
)
from protocol.packed import i32_list, pack_f32, pack_i32, pack_u8
from services.engines.engine import (
    Engine,
    EngineError,
    GenerateRequest,
    InvalidRequestError,
    Sample,
    Sampling,
    TurnTimeout,
)
from services.generator.agent_sandbox import open_session, save_end, snapshot, suspend
from services.generator.tools import (
    ToolBox,
    ToolInfraError,
    ToolSession,
)
from services.generator.trajectory import LoopLimits, Trajectory
from services.model.tokens import ChatTokenizer
from services.model.tool_format import parse_tool_call


class AgentLoop:
    """Turns one task into ``task.n`` rollouts on an engine, running tool calls in between."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: ChatTokenizer,
        tools: ToolBox,
        limits: LoopLimits | None = None,
        *,
        generator: str = "",
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.tools = tools
        self.limits = limits or LoopLimits()
        self.generator = generator

    async def run(self, task: Task) -> list[Rollout]:
        return (await self.run_until(task, _never)).rollouts

    async def run_until(
        self, task: Task, yield_now: Callable[[], bool], *, checkpoints: bool = False
    ) -> Outcome:
        """The task's rollouts; a sample at a turn boundary while ``yield_now()`` is true
        stops there and comes back saved instead (preemption), to go on later from
        ``Task.resume``.  With ``checkpoints`` each sample is saved at every turn boundary
        (its sandbox snapshotted), so that a retry of a failed one goes on from there."""
        started = time.time()
        prompt = self.prompt_ids(task)
        budget = min(task.max_total_tokens or self.limits.max_total_tokens, self.limits.context_len)
        if len(prompt) >= budget:
            reason = f"prompt of {len(prompt)} tokens leaves no room within {budget} tokens"
            return Outcome(
                rollouts=self._all_failed(task, prompt, RolloutStatus.INVALID, reason, started)
            )
        saved = {s.sample_index: s for s in task.resume}
        trajectories = [
            Trajectory.restored(saved[i], prompt)
            if i in saved
            else Trajectory(index=i, prompt=list(prompt))
            for i in task.sample_indices
        ]
        await self._first_turn(task, [t for t in trajectories if t.index not in saved], budget)
        boundary = _Boundary(yield_now=yield_now, checkpoints=checkpoints)
        await asyncio.gather(*(self._continue(task, t, budget, boundary) for t in trajectories))
        return Outcome(
            rollouts=[self._rollout(task, t, started) for t in trajectories if not t.suspended],
            suspended=[t for t in trajectories if t.suspended],
            checkpoints={
                t.index: t.checkpoint
                for t in trajectories
                if t.checkpoint is not None and t.status is RolloutStatus.INFRA_FAILURE
            },
            restore_s=sum(t.restore_s for t in trajectories),
        )

    async def _first_turn(self, task: Task, fresh: list[Trajectory], budget: int) -> None:
        """Turn 1 of the samples that start afresh, as one request (one prefill)."""
        if not fresh:
            return
        prompt = fresh[0].prompt
        try:
            first = await self._generate(
                task, prompt, len(fresh), _route(task), budget - len(prompt), 0
            )
        except EngineError as error:
            for trajectory in fresh:
                trajectory.fail(RolloutStatus.INFRA_FAILURE, str(error), _kind(error))
            return
        except InvalidRequestError as error:
            for trajectory in fresh:
                trajectory.fail(RolloutStatus.INVALID, str(error))
            return
        for trajectory, sample in zip(fresh, first.samples, strict=True):
            trajectory.generate_s += first.elapsed_s
            trajectory.add_generated(sample)

    def prompt_ids(self, task: Task) -> list[int]:
        if task.prompt_tokens:
            return i32_list(task.prompt_tokens)
        return self.tokenizer.render(task.prompt)

    # ------------------------------------------------------------------ turns

    async def _continue(
        self, task: Task, trajectory: Trajectory, budget: int, boundary: _Boundary
    ) -> None:
        """Run tool calls and further turns until the model stops, a limit is reached, or
        the loop is asked to yield (at a turn boundary: before the next tool call)."""
        session: ToolSession | None = None
        resumed = trajectory.snapshot is not None
        try:
            while self._wants_tool(task, trajectory):
                if trajectory.turns >= task.max_turns:
                    trajectory.finish = FinishReason.MAX_TURNS
                    return
                if boundary.yield_now():
                    await suspend(trajectory, session)
                    return
                if boundary.checkpoints:
                    trajectory.checkpoint = trajectory.saved(await snapshot(trajectory, session))
                session = session or await open_session(self.tools, task, trajectory)
                turn_started = time.monotonic()
                await self._tool_turn(session, trajectory)
                if resumed:
                    trajectory.restore_s, resumed = time.monotonic() - turn_started, False
                if trajectory.total >= budget:
                    trajectory.finish = FinishReason.LENGTH
                    return
                await self._next_turn(task, trajectory, budget)
        except ToolInfraError as error:
            trajectory.fail(RolloutStatus.INFRA_FAILURE, f"tool: {error}", FailureKind.TOOL)
        except EngineError as error:
            trajectory.fail(RolloutStatus.INFRA_FAILURE, str(error), _kind(error))
        except InvalidRequestError as error:
            trajectory.fail(RolloutStatus.INVALID, str(error))
        finally:
            if session is not None:
                await save_end(trajectory, session)
                await session.close()

    def _wants_tool(self, task: Task, trajectory: Trajectory) -> bool:
        end = self.tokenizer.tool_call_end_id
        return (
            bool(task.tools)
            and end is not None
            and trajectory.finish is FinishReason.STOP
            and bool(trajectory.completion)
            and trajectory.completion[-1] == end
        )

    async def _tool_turn(self, session: ToolSession, trajectory: Trajectory) -> None:
        last = trajectory.segments[-1]
        text = self.tokenizer.decode(trajectory.completion[last.start : last.end])
        call = parse_tool_call(text)
        started = time.monotonic()
        if isinstance(call, str):
            output, status, name, arguments = f"error: {call}", "invalid", "", text
        else:
            outcome = await session.call(call)
            output, status, name, arguments = outcome.output, outcome.status, call.name, call.raw
        elapsed = time.monotonic() - started
        trajectory.tool_s += elapsed
        trajectory.tool_calls.append(
            ToolCall(
                turn=trajectory.turns - 1,
                name=name,
                arguments=arguments,
                output=output,
                status=status,
                duration_s=elapsed,
            )
        )
        trajectory.add_observation(self.tokenizer.encode(self.tokenizer.observation(output)))

    async def _next_turn(self, task: Task, trajectory: Trajectory, budget: int) -> None:
        ids = trajectory.prompt + trajectory.completion
        room = budget - len(ids)
        # Routed by the task, as turn 1 was: the server that prefilled the group's prompt
        # holds this sample's earlier turns in its prefix cache.
        result = await self._generate(task, ids, 1, task.id, room, trajectory.index + 1)
        trajectory.generate_s += result.elapsed_s
        trajectory.add_generated(result.samples[0])

    async def _generate(
        self, task: Task, ids: list[int], n: int, trajectory_id: str, room: int, salt: int
    ) -> _Generated:
        request = GenerateRequest(
            prompt_ids=ids,
            sampling=self._sampling(task, room, salt),
            n=n,
            trajectory_id=trajectory_id,
        )
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.limits.turn_timeout_s):
                samples = await self.engine.generate(request)
        except TimeoutError as error:
            raise TurnTimeout(f"turn timed out after {self.limits.turn_timeout_s:g}s") from error
        if len(samples) != n:
            raise EngineError(f"engine returned {len(samples)} samples for n={n}")
        return _Generated(samples=samples, elapsed_s=time.monotonic() - started)

    def _sampling(self, task: Task, room: int, salt: int) -> Sampling:
        params = task.sampling
        stops = set(params.stop_token_ids) | set(self.tokenizer.eos_ids)
        stops |= self._single_token_stops(params.stop)
        if task.tools and self.tokenizer.tool_call_end_id is not None:
            stops.add(self.tokenizer.tool_call_end_id)
        return Sampling(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_new_tokens=max(1, min(params.max_tokens, room)),
            stop_token_ids=tuple(sorted(stops)),
            seed=None if params.seed is None else params.seed + salt,
        )

    def _single_token_stops(self, stops: list[str]) -> set[int]:
        """Stop strings that are one token; longer ones cannot stop a token-level engine."""
        found: set[int] = set()
        for text in stops:
            ids = self.tokenizer.encode(text)
            if len(ids) == 1:
                found.add(ids[0])
        return found

    # ------------------------------------------------------------------ results

    def _rollout(self, task: Task, t: Trajectory, started: float) -> Rollout:
        now = time.time()
        queued = max(0.0, started - task.created_at) if task.created_at else 0.0
        return Rollout(
            id=rollout_id(task.id, t.index, task.attempt),
            # The saved states served their purpose: the rollout holds the whole sample.
            task=msgspec.structs.replace(task, resume=[]) if task.resume else task,
            sample_index=t.index,
            tokens=pack_i32(t.prompt + t.completion),
            prompt_len=len(t.prompt),
            logprobs=pack_f32(t.logprobs),
            loss_mask=pack_u8(t.mask),
            segments=t.segments,
            tool_calls=t.tool_calls,
            completion_text=self._text(t),
            finish_reason=t.finish,
            status=t.status,
            error=t.error,
            failure=t.failure,
            # A resumed sample that opened no session since ends in the state it resumed.
            snapshot=t.end_snapshot or t.snapshot,
            snapshot_error=t.end_snapshot_error,
            timings=Timings(
                queued_s=queued, generate_s=t.generate_s, tool_s=t.tool_s, total_s=now - started
            ),
            cached_prompt_tokens=t.cached_tokens,
            engine=self.engine.name,
            generator=self.generator,
            created_at=now,
        )

    def _text(self, trajectory: Trajectory) -> str:
        text = self.tokenizer.decode(trajectory.completion)
        end = self.tokenizer.end_turn
        return text[: -len(end)] if end and text.endswith(end) else text

    def refuse(self, task: Task, reason: str) -> list[Rollout]:
        """Invalid rollouts for a task that is not generated at all (unknown domain, late)."""
        return self._all_failed(
            task, self.prompt_ids(task), RolloutStatus.INVALID, reason, time.time()
        )

    def _all_failed(
        self,
        task: Task,
        prompt: list[int],
        status: RolloutStatus,
        reason: str,
        started: float,
        failure: FailureKind | None = None,
    ) -> list[Rollout]:
        failed = []
        for index in task.sample_indices:
            trajectory = Trajectory(index=index, prompt=list(prompt))
            trajectory.fail(status, reason, failure)
            failed.append(self._rollout(task, trajectory, started))
        return failed


@dataclass(frozen=True, kw_only=True)
class Outcome:
    rollouts: list[Rollout]
    #: Samples that yielded at a turn boundary (preempted), with their state.
    suspended: list[Trajectory] = field(default_factory=list)
    #: The first tool turns of resumed samples (their sandbox restored from a snapshot).
    restore_s: float = 0.0
    #: Failed samples' last turn boundaries (run with ``checkpoints``), to retry from.
    checkpoints: dict[int, SavedTrajectory] = field(default_factory=dict)
    #: Asked to yield while parked at admission: nothing ran, the task goes back whole.
    handed_back: bool = False
    #: A gateway call its caller gave up on (``CallCancel``): nothing is answered.
    cancelled: bool = False


@dataclass(frozen=True, kw_only=True)
class _Boundary:
    """What a sample does at a turn boundary: yield (preempted) or save a checkpoint."""

    yield_now: Callable[[], bool]
    checkpoints: bool


def _route(task: Task) -> str:
    """The engine's routing key of a task's first turn: a gateway call names the
    trajectory it continues, whose earlier turns a server may hold in its prefix cache."""
    if task.call is not None and task.call.route:
        return task.call.route
    return task.id


def _never() -> bool:
    return False


@dataclass(frozen=True, kw_only=True)
class _Generated:
    samples: list[Sample]
    elapsed_s: float


def _kind(error: EngineError) -> FailureKind:
    return FailureKind.TIMEOUT if isinstance(error, TurnTimeout) else FailureKind.ENGINE
