"""The replay buffer's client: the learner's requests for batches and its commits.

Typed calls over :meth:`Bus.ask`; a call that gets no answer of the type asked for raises
an :class:`~services.runtime.ask.AskError`, which the caller maps to its own handling.
"""

from __future__ import annotations

from protocol import subjects
from protocol.messages import Batch, BatchCommit, CommitReply, LeaseRelease, SampleRequest
from services.runtime.bus import Bus


class ReplayClient:
    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    async def sample(self, request: SampleRequest, timeout_s: float) -> Batch:
        """A batch as ``request`` asks (it may wait up to ``request.wait_s`` to fill it)."""
        return await self._bus.ask(subjects.replay_sample(), request, Batch, timeout_s)

    async def commit(self, request: BatchCommit | LeaseRelease, timeout_s: float) -> CommitReply:
        """Ack the trained rollouts for good (BatchCommit), or hand back a learner's leases
        (LeaseRelease)."""
        return await self._bus.ask(subjects.replay_commit(), request, CommitReply, timeout_s)
