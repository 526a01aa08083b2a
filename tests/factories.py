"""Builders of protocol messages shared by the tests."""

from __future__ import annotations

from nats.js import JetStreamContext

from protocol import subjects
from protocol.codec import encode
from protocol.messages import Rollout, ScoredRollout, ScoreStatus, Task


def scored(
    task: Task, index: int, reward: float = 1.0, status: ScoreStatus = ScoreStatus.SCORED
) -> ScoredRollout:
    """Sample ``index`` of ``task``, scored ``reward`` (an empty completion)."""
    rollout = Rollout(id=f"{task.id}-r{index}", task=task, sample_index=index)
    return ScoredRollout(id=f"{task.id}-s{index}", rollout=rollout, reward=reward, status=status)


async def publish_scored(js: JetStreamContext, result: ScoredRollout) -> None:
    """Onto the scored stream, where the replay buffer and the feeder read it."""
    task = result.rollout.task
    await js.publish(subjects.scored(task.domain, task.id), encode(result))
