"""What a validator is, what it returns, and the two ways it can refuse to give a score."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from protocol.messages import Rollout, Task


@dataclass(frozen=True, slots=True)
class Verdict:
    """A validator's judgement of one rollout."""

    score: float
    message: str = ""
    #: A PNG of what was judged, for reports (:attr:`ValidatorDetail.preview`).
    preview: bytes | None = None


class InfraFailure(Exception):
    """The judging machinery failed (sandbox down, model error): the rollout gets no reward.

    Any other exception a validator raises is treated the same way; this one says so on purpose.
    """


class InvalidRollout(Exception):
    """The rollout cannot be judged at all (its task lacks the reference data, say)."""


class Validator(Protocol):
    """Scores one rollout.  Raise InfraFailure or InvalidRollout instead of returning a score."""

    async def score(self, rollout: Rollout) -> Verdict: ...


class RuleValidator:
    """Base of the pure-Python validators: a synchronous check run inline on the event loop.

    They are linear in the completion and take microseconds; a thread hop would cost more.
    """

    def check(self, rollout: Rollout) -> Verdict:
        raise NotImplementedError

    async def score(self, rollout: Rollout) -> Verdict:
        return self.check(rollout)


def reference(task: Task, key: str) -> Any:
    """``task.metadata[key]``; its absence makes the rollout invalid, not a zero."""
    metadata: Mapping[str, Any] = task.metadata
    if key not in metadata:
        raise InvalidRollout(f"task {task.id} has no metadata[{key!r}] to judge against")
    return metadata[key]


def references(task: Task, key: str) -> list[str]:
    """One or several acceptable answers (a string or a list of strings)."""
    value = reference(task, key)
    if isinstance(value, str):  # the common case, checked first: this runs per rollout
        return [value]
    values = value if isinstance(value, list) else [value]
    # A tuple, not ``str | int | float``: that builds a union object on every test.
    if not values or not all(isinstance(v, (str, int, float)) for v in values):
        raise InvalidRollout(f"task {task.id}: metadata[{key!r}] is not an answer or a list")
    return [str(v) for v in values]
