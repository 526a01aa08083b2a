"""A closed session as Rollouts: what replay, learner and ledger take like any other work.

The session becomes one task (its id is the session's, so a republished session is
deduplicated by rollout id) whose samples are its trajectories.  Each trajectory's
first prompt is the rollout's prompt; everything after it is the completion, with the
generated segments trained (mask 1, behaviour log-probabilities, their policy version)
and the tokens between them (tool results, user turns) masked out (mask 0, log-prob 0,
segment kind ``tool``), exactly as the generator's own multi-turn rollouts are.
"""

from __future__ import annotations

from protocol import subjects
from protocol.messages import DEFAULT_TIER, Rollout, Task, rollout_id
from protocol.packed import pack_f32, pack_i32, pack_u8
from services.gateway.sessions import Session, Trajectory

#: ``Task.metadata["source"]`` of a session's task.
SOURCE = "gateway"


def session_task(session: Session, *, domain: str, tier: int = DEFAULT_TIER) -> Task:
    """The task a session's rollouts belong to: one sample per trajectory."""
    # The subject checks the domain, tier and tenant as the stack will route them.
    subjects.task(tier, domain, session.owner.tenant)
    first = session.trajectories[0]
    return Task(
        id=session.id,
        domain=domain,
        tier=tier,
        tenant=session.owner.tenant,
        prompt_tokens=pack_i32(first.prompt),
        n=len(session.trajectories),
        max_turns=max(t.calls for t in session.trajectories),
        metadata={"source": SOURCE, "key": session.owner.key_id, "calls": session.calls},
    )


def to_rollouts(session: Session, *, task: Task, created_at: float) -> list[Rollout]:
    """One Rollout of ``task`` per trajectory, in order; none for a session without a call."""
    if not session.trajectories:
        return []
    return [
        _rollout(task, index, trajectory, created_at)
        for index, trajectory in enumerate(session.trajectories)
    ]


def _rollout(task: Task, index: int, trajectory: Trajectory, created_at: float) -> Rollout:
    return Rollout(
        id=rollout_id(task.id, index),
        task=task,
        sample_index=index,
        tokens=pack_i32(trajectory.prompt + trajectory.completion),
        prompt_len=len(trajectory.prompt),
        logprobs=pack_f32(trajectory.logprobs),
        loss_mask=pack_u8(trajectory.mask),
        segments=list(trajectory.segments),
        completion_text=trajectory.text,
        finish_reason=trajectory.finish,
        created_at=created_at,
    )
