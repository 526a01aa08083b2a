"""``POST /v1/temper/sessions/{name}/reward``: the caller's reward closes a session, whose
trajectories then go on the bus as scored rollouts, to the replay buffer and the learner
like any other work.

The body is ``{"reward": r}`` (every trajectory) or ``{"rewards": [r0, r1, ...]}`` (one
per trajectory, in the order they began).  A reward is a finite number in the range the
learner accepts for a domain it does not know, -1 to 1.  Each rollout is published with
its id as ``Nats-Msg-Id``: a session sent twice lands once.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from protocol import subjects
from protocol.messages import ScoredRollout, ScoreStatus
from services.gateway.errors import ApiError
from services.gateway.requests import decode_body
from services.gateway.rollouts import session_task, to_rollouts
from services.gateway.sessions import Session, SessionStore
from services.runtime.bus import Bus

#: The range the learner accepts for a domain it does not know (reward_bounds).
LOW, HIGH = -1.0, 1.0
Reward = Annotated[float, Meta(ge=LOW, le=HIGH)]


class RewardRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reward: Reward | None = None
    rewards: Annotated[list[Reward], Meta(min_length=1)] | None = None


_DECODER = msgspec.json.Decoder(RewardRequest)
#: Who scored a session's rollouts (``ScoredRollout.validator``).
VALIDATOR = "gateway"


class Rewards:
    def __init__(self, bus: Bus, sessions: SessionStore, domain: str) -> None:
        self._bus = bus
        self._sessions = sessions
        self._domain = domain
        self.published = 0

    async def close(self, key_id: str, name: str, body: bytes) -> dict[str, Any]:
        """Score the session ``name`` of the key and publish it; what was published."""
        request = _parse(body)
        session = self._sessions.get(key_id, name)
        if session is None:
            raise ApiError(
                404, f"no open session {name!r} for this key", param="session", code="no_session"
            )
        if session.problem is not None:
            return await self._validate(session, request)
        if request.reward is None and request.rewards is None:
            raise ApiError(
                400, "give one of `reward` and `rewards`", param="reward", code="invalid_value"
            )
        rewards = _rewards(request, len(session.trajectories))
        self._sessions.close(key_id, name)
        ids = await self._publish(session, rewards)
        return _closed(session, ids, scored_by=VALIDATOR)

    async def _validate(self, session: Session, request: RewardRequest) -> dict[str, Any]:
        """A session bound to a problem: its domain's validators score it, not the caller."""
        problem = session.problem
        assert problem is not None
        if request.reward is not None or request.rewards is not None:
            raise ApiError(
                409,
                f"session {session.name!r} answers a problem of {problem.domain.name!r}: its "
                "validators score it; close it with an empty body ({})",
                param="reward",
                code="scored_by_validators",
            )
        self._sessions.close(session.owner.key_id, session.name)
        ids: list[str] = []
        if session.trajectories:
            task = problem.task(session)
            for rollout in to_rollouts(session, task=task, created_at=time.time()):
                subject = subjects.rollout(task.domain)
                await self._bus.publish(subject, rollout, msg_id=rollout.id)
                self.published += 1
                ids.append(rollout.id)
        return _closed(session, ids, scored_by=problem.domain.name)

    async def _publish(self, session: Session, rewards: list[float]) -> list[str]:
        now = time.time()
        task = session_task(session, domain=self._domain)
        rollouts = to_rollouts(session, task=task, created_at=now)
        for rollout, reward in zip(rollouts, rewards, strict=True):
            scored = ScoredRollout(
                id=rollout.id,
                rollout=rollout,
                reward=reward,
                status=ScoreStatus.SCORED,
                validator=VALIDATOR,
                scored_at=now,
            )
            subject = subjects.scored(self._domain, rollout.task.id)
            await self._bus.publish(subject, scored, msg_id=scored.id)
            self.published += 1
        return [r.id for r in rollouts]


def _parse(body: bytes) -> RewardRequest:
    request = decode_body(body, _DECODER)
    if request.reward is not None and request.rewards is not None:
        raise ApiError(
            400, "give one of `reward` and `rewards`", param="reward", code="invalid_value"
        )
    return request


def _closed(session: Session, ids: list[str], *, scored_by: str) -> dict[str, Any]:
    """The answer to a close: the session, its rollouts' ids and who scores them (the
    gateway, for a caller's reward; else the domain whose validators do)."""
    return {
        "object": "temper.session",
        "id": session.id,
        "name": session.name,
        "rollouts": ids,
        "scored_by": scored_by,
    }


def _rewards(request: RewardRequest, trajectories: int) -> list[float]:
    # A session opens with its first recorded call: it has a trajectory at least.
    if request.rewards is None:
        assert request.reward is not None
        return [request.reward] * trajectories
    if len(request.rewards) != trajectories:
        raise ApiError(
            422,
            f"`rewards` has {len(request.rewards)} numbers; the session has "
            f"{trajectories} trajectories",
            param="rewards",
            code="invalid_value",
        )
    if not all(math.isfinite(r) for r in request.rewards):
        raise ApiError(422, "`rewards` must be finite", param="rewards", code="invalid_value")
    return list(request.rewards)
