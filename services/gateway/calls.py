"""Generation for the gateway: a call travels as a Task on its key's tier stream, so the
generators' tiers, fair share between tenants and staleness admission apply to it as
to any task; the generator that serves it answers on this instance's reply subject.

Nothing of a call is durable past the wait: a call nobody waits for any more carries a
deadline the generators honour, and an answer that comes after the wait is dropped.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import nats.errors

from protocol import subjects
from protocol.messages import CallCancel, CallResult, GatewayCall, SamplingParams, Task
from protocol.packed import pack_i32
from services.runtime.bus import Bus


class CallTimeout(TimeoutError):
    """No generator answered within the call's timeout."""


@dataclass(frozen=True, kw_only=True)
class CallRequest:
    """What one call asks of a generator."""

    prompt: list[int]
    sampling: SamplingParams
    n: int
    domain: str
    tenant: str
    tier: int
    #: The trajectory it continues or starts (the engine's routing key).
    route: str
    #: Trajectories it starts (the staleness admission waits for room for them).
    new_samples: int


class Calls:
    """Sends calls and matches the answers to them, by task id."""

    def __init__(self, bus: Bus, instance: str, timeout_s: float) -> None:
        self._bus = bus
        # A host name may hold dots, which a subject token may not.
        self._instance = re.sub(r"[^A-Za-z0-9_-]", "-", instance)[:100]
        self.timeout_s = timeout_s
        self._waiting: dict[str, asyncio.Future[CallResult]] = {}
        self.counts: Counter[str] = Counter()

    @property
    def subject(self) -> str:
        """Where this instance hears its answers."""
        return subjects.gateway_replies(self._instance)

    async def answered(self, result: CallResult) -> None:
        """An answer came: hand it to its call (one given up on is only counted)."""
        waiting = self._waiting.pop(result.task_id, None)
        if waiting is None or waiting.done():
            self.counts["answers_late"] += 1
            return
        waiting.set_result(result)

    async def generate(self, request: CallRequest) -> CallResult:
        """The call's samples; ``CallTimeout`` when no generator answers in time."""
        task = self._task(request)
        answer = asyncio.get_running_loop().create_future()
        self._waiting[task.id] = answer
        self.counts["sent"] += 1
        try:
            await self._bus.publish(subjects.of_task(task), task, msg_id=task.id)
            return await asyncio.wait_for(answer, self.timeout_s)
        except TimeoutError:
            self.counts["timed_out"] += 1
            raise CallTimeout(f"no generator answered within {self.timeout_s:g} s") from None
        except asyncio.CancelledError:
            # The client went away: the generator serving the call stops and frees its
            # place (a generator that has not started it drops it).
            self.counts["cancelled"] += 1
            assert task.deadline is not None
            await self._cancel(CallCancel(task_id=task.id, until=task.deadline))
            raise
        finally:
            self._waiting.pop(task.id, None)

    async def _cancel(self, message: CallCancel) -> None:
        try:
            await self._bus.emit(subjects.gateway_cancel(), message)
        except (nats.errors.Error, OSError):
            # Lost with the bus: the call's deadline still ends it.
            self.counts["cancels_unsent"] += 1

    def _task(self, request: CallRequest) -> Task:
        task_id = f"gwc-{uuid.uuid4().hex}"
        now = time.time()
        return Task(
            id=task_id,
            domain=request.domain,
            tier=request.tier,
            tenant=request.tenant,
            prompt_tokens=pack_i32(request.prompt),
            sampling=request.sampling,
            # The gateway checked it against the model's context; a generator's own default
            # budget (for its tasks) does not cut a call short.
            max_total_tokens=len(request.prompt) + request.sampling.max_tokens,
            n=request.n,
            created_at=now,
            # A generator refuses a call nobody waits for any more.
            deadline=now + self.timeout_s,
            metadata={"source": "gateway"},
            call=GatewayCall(
                reply=subjects.gateway_reply(self._instance, task_id),
                route=request.route,
                new_samples=request.new_samples,
            ),
        )

    def statistics(self) -> dict[str, float]:
        values = {f"calls_{name}": float(count) for name, count in self.counts.items()}
        values["calls_waiting"] = float(len(self._waiting))
        return values
