"""Rejected input: an ErrorEvent for people, and a dead letter that keeps the original bytes."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from protocol import headers as h
from protocol import subjects
from protocol.codec import headers_size
from protocol.errors import ErrorCode
from protocol.messages import ErrorEvent
from services.runtime.bus import Bus
from services.runtime.metrics import ServiceMetrics

#: Room kept for the event's own fields and headers when the original is embedded.
_EVENT_OVERHEAD = 8192


@dataclass(frozen=True, kw_only=True)
class Rejection:
    """Why a message was refused, and where it came from."""

    code: ErrorCode
    message: str
    field: str | None = None
    #: Stream name, or the service name for request subjects.
    source: str
    subject: str
    deliveries: int = 1
    #: Stable id of the original (stream sequence) so a retried rejection is stored once.
    key: str | None = None


class DeadLetters:
    def __init__(self, bus: Bus, service: str, instance: str, metrics: ServiceMetrics) -> None:
        self._bus = bus
        self._service = service
        self._instance = instance
        self._metrics = metrics

    async def event(self, rejection: Rejection, data: bytes, trace_id: str) -> None:
        """Publish an ErrorEvent; the original is cut to fit under ``max_payload``."""
        room = max(0, self._bus.max_payload - _EVENT_OVERHEAD - len(rejection.message))
        event = ErrorEvent(
            code=rejection.code,
            message=rejection.message,
            field=rejection.field,
            service=self._service,
            instance=self._instance,
            subject=rejection.subject,
            trace_id=trace_id,
            original=data[:room],
            original_size=len(data),
            truncated=len(data) > room,
            at=time.time(),
        )
        msg_id = f"err:{rejection.key}" if rejection.key else None
        await self._bus.publish(
            subjects.error_event(self._service), event, trace_id=trace_id, msg_id=msg_id
        )
        self.count(rejection)

    def count(self, rejection: Rejection) -> None:
        """Count bad input; :meth:`event` does, and an observer that publishes nothing."""
        self._metrics.bad_input.labels(source=rejection.source, code=rejection.code.value).inc()

    async def dead_letter(
        self, rejection: Rejection, data: bytes, original_headers: Mapping[str, str] | None
    ) -> None:
        """Store the original bytes unchanged with ``Temper-Dlq-*`` headers saying why."""
        hdrs = {k: v for k, v in (original_headers or {}).items() if k != h.MSG_ID}
        hdrs.update(
            {
                h.DLQ_CODE: rejection.code.value,
                h.DLQ_REASON: h.clean(rejection.message),
                h.DLQ_SUBJECT: rejection.subject,
                h.DLQ_SOURCE: rejection.source,
                h.DLQ_SERVICE: self._service,
                h.DLQ_DELIVERIES: str(rejection.deliveries),
                h.DLQ_AT: f"{time.time():.6f}",
            }
        )
        if rejection.field:
            hdrs[h.DLQ_FIELD] = h.clean(rejection.field)
        if rejection.key:
            hdrs[h.MSG_ID] = f"dlq:{rejection.key}"
        room = self._bus.max_payload - headers_size(hdrs) - 64
        if len(data) > room:
            # Only an input already at the size limit gets here; keep what fits and say so.
            hdrs[h.DLQ_TRUNCATED] = str(len(data))
            data = data[: max(0, room)]
        await self._bus.publish_raw(subjects.dead_letter(rejection.source), data, hdrs)
        self._metrics.dead_lettered.labels(source=rejection.source).inc()

    async def reject(
        self, rejection: Rejection, data: bytes, original_headers: Mapping[str, str] | None
    ) -> None:
        trace_id = (original_headers or {}).get(h.TRACE_ID, "")
        await self.event(rejection, data, trace_id)
        await self.dead_letter(rejection, data, original_headers)
