"""Sessions: the calls of one agent, kept as token-exact trajectories (docs/gateway.md).

Pure: no I/O, time passed in.  A session is named by the caller (``X-Temper-Session`` or
the request's ``user``) under its API key.  Each call brings the exact prompt ids the
engine saw and, per choice, the completion ids with their behaviour log-probabilities,
under one policy version.

The rule: a call whose prompt starts with every token of a trajectory so far (its first
prompt, then each completion and what came between) continues that trajectory; the
earlier completions stay trained segments and the new tokens between them and this
call's completion (tool results, user turns) are masked out of the loss.  When several
trajectories fit, the longest does.  When none does (the agent rewrote its history, or a
parallel conversation began), the call starts a new trajectory in the same session.  A
call with several choices forks: the first choice continues, each other one is a copy of
the trajectory before it, continued by that choice.

A session idle past its key's timeout is dropped and counted, never trained on.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from protocol.messages import FinishReason, Segment

if TYPE_CHECKING:
    from services.gateway.problems import BoundProblem

#: The header that names a session; the request's ``user`` field is the fallback.
SESSION_HEADER = "X-Temper-Session"
MAX_NAME = 256


class SessionError(Exception):
    """A call the sessions cannot record."""


class BadSessionName(SessionError, ValueError):
    def __init__(self, message: str, source: str) -> None:
        super().__init__(message)
        self.source = source


class TooManySessions(SessionError):
    """Every session slot is taken by an open session."""


class SessionFull(SessionError):
    """The session holds as many trajectories as it may."""


def session_name(header: str | None, user: str | None) -> str | None:
    """The session a call belongs to: the header, else ``user``, else None (not recorded)."""
    for value, source in ((header, SESSION_HEADER), (user, "user")):
        if value is None:
            continue
        if not value.strip() or len(value) > MAX_NAME or not value.isprintable():
            raise BadSessionName(
                f"{source}: a session name is 1 to {MAX_NAME} printable characters", source
            )
        return value
    return None


def new_session_id() -> str:
    """Unique across restarts: the id of the task its rollouts will belong to."""
    return f"gw-{uuid.uuid4().hex}"


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One choice of a call: generated ids and their behaviour log-probabilities."""

    ids: Sequence[int]
    logprobs: Sequence[float]
    finish: FinishReason = FinishReason.STOP
    #: The text the caller received (a validator reads the last one).
    text: str = ""

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.logprobs):
            raise ValueError(
                f"{len(self.ids)} completion ids but {len(self.logprobs)} log-probabilities"
            )


@dataclass(frozen=True, kw_only=True)
class Call:
    """One generation: the exact prompt ids, its choices and the policy version."""

    prompt: Sequence[int]
    choices: Sequence[Completion]
    version: int

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("a call has prompt ids")
        if not self.choices:
            raise ValueError("a call has at least one choice")
        if self.version < 0:
            raise ValueError(f"policy version {self.version} is negative")


@dataclass(kw_only=True)
class Trajectory:
    """A token sequence under construction, as a Rollout will carry it."""

    prompt: list[int]
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    calls: int = 0
    finish: FinishReason = FinishReason.STOP
    text: str = ""

    @property
    def total(self) -> int:
        return len(self.prompt) + len(self.completion)

    def continued_by(self, prompt: Sequence[int]) -> bool:
        """Whether ``prompt`` starts with every token of this trajectory, exactly."""
        start, total = len(self.prompt), self.total
        return (
            len(prompt) >= total
            and list(prompt[:start]) == self.prompt
            and list(prompt[start:total]) == self.completion
        )

    def append(self, prompt: Sequence[int], choice: Completion, version: int) -> None:
        """Add what came since (masked out) and the completion (trained)."""
        between = list(prompt[self.total :])
        if between:
            self._add(between, [0.0] * len(between), trained=False, version=None)
        if choice.ids:
            self._add(
                list(choice.ids), [float(x) for x in choice.logprobs], trained=True, version=version
            )
        self.calls += 1
        self.finish = choice.finish
        self.text = choice.text

    def _add(
        self, ids: list[int], logprobs: list[float], *, trained: bool, version: int | None
    ) -> None:
        start = len(self.completion)
        self.completion.extend(ids)
        self.logprobs.extend(logprobs)
        self.mask.extend([int(trained)] * len(ids))
        kind: Literal["gen", "tool"] = "gen" if trained else "tool"
        self.segments.append(
            Segment(start=start, end=len(self.completion), kind=kind, version=version)
        )

    @property
    def oldest_version(self) -> int | None:
        """The policy version of its oldest generated segment: staleness counts from it."""
        versions = [s.version for s in self.segments if s.version is not None]
        return min(versions) if versions else None

    def fresh(self, version: int, max_staleness: int) -> bool:
        """Whether a call at ``version`` may still add to it (0: no bound)."""
        oldest = self.oldest_version
        return not max_staleness or oldest is None or version - oldest <= max_staleness

    def fork(self) -> Trajectory:
        return Trajectory(
            prompt=list(self.prompt),
            completion=list(self.completion),
            logprobs=list(self.logprobs),
            mask=list(self.mask),
            segments=list(self.segments),
            calls=self.calls,
            finish=self.finish,
            text=self.text,
        )


@dataclass(frozen=True, kw_only=True)
class Owner:
    """Whose a session is: the caller's key (by id) and tenant."""

    key_id: str
    tenant: str
    timeout_s: float


@dataclass(kw_only=True)
class Session:
    id: str
    name: str
    owner: Owner
    opened_at: float
    last_active: float
    trajectories: list[Trajectory] = field(default_factory=list)
    calls: int = 0
    #: What the gateway answered, to extend the next call's prompt from (its prompts room).
    notes: list[Any] = field(default_factory=list)
    #: The problem it answers, when its domain's validators score it (its problems room).
    problem: BoundProblem | None = None

    def expired(self, now: float) -> bool:
        return now - self.last_active >= self.owner.timeout_s

    def continued(
        self, prompt: Sequence[int], version: int = 0, max_staleness: int = 0
    ) -> int | None:
        """The index of the longest trajectory ``prompt`` continues, or None.  A trajectory
        whose oldest segment is more than ``max_staleness`` versions behind ``version`` is
        not continued: the learner would drop it whole as stale, so the call starts a new
        one, with the earlier turns as its prompt (0: no bound)."""
        fits = [
            i
            for i, t in enumerate(self.trajectories)
            if t.continued_by(prompt) and t.fresh(version, max_staleness)
        ]
        return max(fits, key=lambda i: self.trajectories[i].total, default=None)


@dataclass(frozen=True, kw_only=True)
class Recorded:
    session_id: str
    #: The trajectory of each choice, in order.
    trajectories: tuple[int, ...]
    #: Whether the first choice continued a trajectory (False: a new one began).
    continued: bool


class SessionStore:
    """The open sessions, bounded; expired ones are dropped and counted."""

    def __init__(
        self,
        *,
        max_sessions: int,
        max_trajectories: int,
        max_staleness: int = 0,
        new_id: Callable[[], str] = new_session_id,
        on_open: Callable[[str], None] = lambda _: None,
        on_end: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.max_sessions = max_sessions
        self.max_trajectories = max_trajectories
        #: How many versions a trajectory may span and still be continued (0: any).
        self.max_staleness = max_staleness
        #: Told each session id as it opens, and as it ends (closed or expired).
        self._on_open = on_open
        self._on_end = on_end
        self._new_id = new_id
        self._open: dict[tuple[str, str], Session] = {}
        self.expired_sessions = 0
        self.expired_calls = 0
        self.closed_sessions = 0

    def __len__(self) -> int:
        return len(self._open)

    def get(self, key_id: str, name: str) -> Session | None:
        return self._open.get((key_id, name))

    def record(self, owner: Owner, name: str, call: Call, now: float) -> Recorded:
        session = self._session(owner, name, now)
        found = session.continued(call.prompt, call.version, self.max_staleness)
        added = len(call.choices) - (1 if found is not None else 0)
        if len(session.trajectories) + added > self.max_trajectories:
            raise SessionFull(
                f"session holds {len(session.trajectories)} trajectories; "
                f"{added} more would pass the bound of {self.max_trajectories}"
            )
        base = session.trajectories[found] if found is not None else None
        template = base.fork() if base is not None else Trajectory(prompt=list(call.prompt))
        indices: list[int] = []
        for number, choice in enumerate(call.choices):
            if number == 0 and found is not None:
                target, index = session.trajectories[found], found
            else:
                target, index = template.fork(), len(session.trajectories)
                session.trajectories.append(target)
            target.append(call.prompt, choice, call.version)
            indices.append(index)
        session.calls += 1
        session.last_active = now
        return Recorded(
            session_id=session.id, trajectories=tuple(indices), continued=found is not None
        )

    def open(self, owner: Owner, name: str, now: float) -> Session:
        """The open session ``name`` of the owner's key, opened now if it is not."""
        return self._session(owner, name, now)

    def _session(self, owner: Owner, name: str, now: float) -> Session:
        key = (owner.key_id, name)
        session = self._open.get(key)
        if session is not None and session.expired(now):
            self._drop(key)
            session = None
        if session is not None:
            return session
        if len(self._open) >= self.max_sessions:
            self.expire(now)
        if len(self._open) >= self.max_sessions:
            raise TooManySessions(f"all {self.max_sessions} session slots are open")
        session = Session(id=self._new_id(), name=name, owner=owner, opened_at=now, last_active=now)
        self._open[key] = session
        self._on_open(session.id)
        return session

    def close(self, key_id: str, name: str) -> Session | None:
        """Take a session out, to become training data; None when it is not open."""
        session = self._open.pop((key_id, name), None)
        if session is not None:
            self.closed_sessions += 1
            self._on_end(session.id)
        return session

    def expire(self, now: float) -> int:
        """Drop every session idle past its timeout; how many were dropped."""
        stale = [key for key, session in self._open.items() if session.expired(now)]
        for key in stale:
            self._drop(key)
        return len(stale)

    def _drop(self, key: tuple[str, str]) -> None:
        session = self._open.pop(key)
        self._on_end(session.id)
        self.expired_sessions += 1
        self.expired_calls += session.calls

    def statistics(self) -> dict[str, float]:
        return {
            "sessions_open": float(len(self._open)),
            "sessions_closed": float(self.closed_sessions),
            "sessions_expired": float(self.expired_sessions),
            "calls_expired": float(self.expired_calls),
        }
