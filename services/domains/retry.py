"""A domain's retry policy: how often, how soon, and after which failures its samples are
generated again.  The generator applies it (services.generator.retries)."""

from __future__ import annotations

import math

import msgspec

from protocol.messages import FailureKind

#: Every failure kind retries by default: each is the machinery's, never the policy's.
RETRY_ON: tuple[FailureKind, ...] = tuple(FailureKind)


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Retries of a domain's failed samples.  A wrong answer is scored, not failed: it
    never retries."""

    #: Tries in all, the first one included: 1 never retries.
    max_attempts: int = 3
    #: The wait before retry k (k >= 1) is ``backoff_s * 2**(k-1)``, at most ``backoff_max_s``.
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    on: tuple[FailureKind, ...] = RETRY_ON
    #: A multi-turn sample is checkpointed at every turn boundary (its conversation, and
    #: a snapshot of its sandbox session), and its retry goes on from the last one.
    resume: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        for name in ("backoff_s", "backoff_max_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, not {value}")

    def retries(self, failure: FailureKind | None, attempt: int) -> bool:
        """Whether a sample that failed so on try ``attempt`` (0-based) goes again."""
        return failure is not None and failure in self.on and attempt + 1 < self.max_attempts

    def backoff(self, next_attempt: int) -> float:
        """Seconds to wait before try ``next_attempt`` (1-based retries)."""
        exponent = min(max(next_attempt - 1, 0), 30)
        return float(min(self.backoff_s * 2**exponent, self.backoff_max_s))
