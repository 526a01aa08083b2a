"""One sample of a task while it is generated: token ids, masks, logprobs and segments.

Kept as token ids from start to end.  Each turn appends the tokens the engine generated
(loss mask 1, with their behaviour logprobs and policy version), and a tool call appends
the observation's tokens (mask 0, logprob 0), encoded on their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.messages import (
    FailureKind,
    FinishReason,
    RolloutStatus,
    SavedTrajectory,
    Segment,
    ToolCall,
)
from protocol.packed import f32_list, i32_list, pack_f32, pack_i32, pack_u8, unpack_u8
from services.engines.engine import Sample

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


@dataclass(frozen=True, kw_only=True)
class LoopLimits:
    #: The model's context: a prompt that does not fit is an invalid task.
    context_len: int = 4096
    #: Prompt plus completion, when the task sets no ``max_total_tokens``.
    max_total_tokens: int = 4096
    turn_timeout_s: float = 120.0


@dataclass(kw_only=True)
class Trajectory:
    """One sample of a task while it is being generated."""

    index: int
    prompt: list[int]
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    cached_tokens: int = 0
    turns: int = 0
    finish: FinishReason = FinishReason.STOP
    status: RolloutStatus = RolloutStatus.OK
    error: str | None = None
    failure: FailureKind | None = None
    generate_s: float = 0.0
    tool_s: float = 0.0
    #: The sandbox snapshot its tool session starts from (a resumed trajectory's).
    snapshot: str | None = None
    #: Asked to yield at a turn boundary, and did: saved, not finished.
    suspended: bool = False
    #: Seconds spent saving its state, and on the first tool turn after a resume
    #: (opening the sandbox from the snapshot included).
    save_s: float = 0.0
    restore_s: float = 0.0
    #: Its state at the last turn boundary, when checkpoints are on.
    checkpoint: SavedTrajectory | None = None
    #: The snapshot of its sandbox at its end (what a judge reads), or why none was taken.
    end_snapshot: str | None = None
    end_snapshot_error: str | None = None

    @classmethod
    def restored(cls, saved: SavedTrajectory, prompt: list[int]) -> Trajectory:
        """A suspended sample as it was when it yielded."""
        return cls(
            index=saved.sample_index,
            prompt=list(prompt),
            completion=i32_list(saved.completion),
            logprobs=f32_list(saved.logprobs),
            mask=[int(m) for m in unpack_u8(saved.loss_mask)],
            segments=list(saved.segments),
            tool_calls=list(saved.tool_calls),
            cached_tokens=saved.cached_tokens,
            turns=saved.turns,
            generate_s=saved.generate_s,
            tool_s=saved.tool_s,
            snapshot=saved.snapshot,
        )

    def saved(self, snapshot: str | None = None) -> SavedTrajectory:
        """Its state now, with ``snapshot`` of its sandbox (default: the one it started from)."""
        return SavedTrajectory(
            sample_index=self.index,
            completion=pack_i32(self.completion),
            logprobs=pack_f32(self.logprobs),
            loss_mask=pack_u8(self.mask),
            # Copies: the trajectory goes on after a checkpoint.
            segments=list(self.segments),
            tool_calls=list(self.tool_calls),
            turns=self.turns,
            cached_tokens=self.cached_tokens,
            generate_s=self.generate_s,
            tool_s=self.tool_s,
            snapshot=snapshot or self.snapshot,
        )

    def suspend(self, snapshot: str | None, save_s: float) -> None:
        self.snapshot = snapshot
        self.suspended = True
        self.save_s = save_s

    @property
    def total(self) -> int:
        return len(self.prompt) + len(self.completion)

    def add_generated(self, sample: Sample) -> None:
        start = len(self.completion)
        self.completion.extend(sample.output_ids)
        self.logprobs.extend(sample.logprobs)
        self.mask.extend([1] * len(sample.output_ids))
        self.segments.append(
            Segment(
                start=start,
                end=len(self.completion),
                kind="gen",
                version=sample.version,
                server=sample.server,
                cached_tokens=sample.cached_tokens,
            )
        )
        self.cached_tokens += sample.cached_tokens
        self.turns += 1
        self.finish = _FINISH[sample.finish]

    def add_observation(self, ids: list[int]) -> None:
        start = len(self.completion)
        self.completion.extend(ids)
        self.logprobs.extend([0.0] * len(ids))
        self.mask.extend([0] * len(ids))
        self.segments.append(Segment(start=start, end=len(self.completion), kind="tool"))

    def fail(self, status: RolloutStatus, error: str, failure: FailureKind | None = None) -> None:
        self.status = status
        self.error = error
        self.failure = failure
        self.finish = FinishReason.ERROR
