"""Admission by staleness (AReaL's max_head_offpolicyness, prime-rl's max_async_level).

A sample started now is trained on once the learner has consumed everything admitted
before it.  Keeping what is admitted but not yet trained under ``budget`` samples (the
learner's batch times the staleness it may use) means a rollout lands in the replay
buffer while it is still fresh enough to train on, so the buffer rarely has to drop
stale samples, and generation never runs ahead of training into waste.

The learner reports in every PolicyUpdate how many samples have settled: trained, or let
go untrained by the replay buffer (stale, excluded) on their way to it
(``settled_samples``).  Counting only what was trained, every dropped sample would stay
"ahead" for good: over a long run with preemptions (about 200 stale drops in 15 minutes of
the tool run) the budget would fill and nothing would start again.

The budget is per generator instance: with several generators, give each its share.
"""

from __future__ import annotations

import asyncio


class StalenessAdmission:
    def __init__(self, budget: int) -> None:
        #: Samples admitted ahead of the learner; 0 admits everything.
        self.budget = budget
        self.started = 0
        self.trained = 0
        self.waits = 0
        self.closed = False
        self._changed = asyncio.Event()

    def allows(self, samples: int) -> bool:
        ahead = self.started - self.trained
        # Nothing ahead: a task larger than the whole budget still goes, alone.
        return not self.budget or ahead <= 0 or ahead + samples <= self.budget

    async def admit(self, samples: int, *, reserve: bool = True) -> None:
        """Wait until ``samples`` more fit within the budget, then count them as started
        (unless not ``reserve``: they only wait for room).

        Once the gate is closed a waiter is cancelled: the consumer hands its task back
        (a nak), as it does for any handler cancelled while the service stops."""
        if not self.allows(samples):
            self.waits += 1
        while not self.allows(samples):
            if self.closed:
                raise asyncio.CancelledError("admission closed: the generator is stopping")
            changed = self._changed
            await changed.wait()
        if reserve:
            self.started += samples

    def release(self, samples: int) -> None:
        """Admitted samples that did not start after all (handed back before generating)."""
        if samples:
            self.started -= samples
            self._wake()

    def close(self) -> None:
        """The service is stopping: the learner step a waiter needs may never come, so
        waiting out the stop's grace would only delay the hand-back."""
        self.closed = True
        self._wake()

    def learner_trained(self, samples: int) -> None:
        """``samples`` have settled in all: trained or dropped (from a PolicyUpdate)."""
        if samples <= self.trained:
            return
        self.trained = samples
        # What the learner consumed was started by someone: a generator that restarted, or
        # that shares the learner with others, must not count it as room for more.
        self.started = max(self.started, samples)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def ahead(self) -> int:
        return max(0, self.started - self.trained)
