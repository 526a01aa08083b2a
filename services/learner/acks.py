"""The weight transaction's second half: which live generators serve an announced version.

After a PolicyUpdate the learner goes on training; a task of its own collects the
WeightSyncAcks for up to a bound and sorts the live generators into acked, failed (their
ack carried an error) and lagging (no word in time), each with the newest version it
reported.  Nobody waits longer than the bound.

Live means heard from (heartbeat or ack) within ``live_after_s``; a STOPPED heartbeat
ends it at once.  A generator has acked a version once it reported that version or a
newer one, in an ack or in its heartbeat: one that loaded v7 before the round for v6
began has v6 covered, and one already serving a re-announced version need not ack again.

:class:`AckBook` is the state alone, fed with explicit times; :class:`WeightAcks` adds
the subscriptions (through the owning service) and the waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import structlog

from protocol import subjects
from protocol.codec import Codec
from protocol.messages import Heartbeat, ServiceState, WeightSyncAck
from services.runtime.responder import Request
from services.runtime.service import Service


@dataclass(frozen=True, kw_only=True)
class AckSettings:
    #: The service whose instances load the weights.
    service: str = "generator"
    #: How long a round waits for every live generator.
    timeout_s: float = 60.0
    #: Silent for longer than this (three default heartbeats): not counted as live.
    live_after_s: float = 15.0


@dataclass(frozen=True, slots=True)
class GeneratorReport:
    instance: str
    #: The newest version it reported serving; None if it never said.
    version: int | None
    #: Why its load of the round's version (or a newer one) failed.
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class AckRound:
    version: int
    acked: tuple[GeneratorReport, ...] = ()
    failed: tuple[GeneratorReport, ...] = ()
    lagging: tuple[GeneratorReport, ...] = ()
    #: From the start of the round until every live generator answered, or the timeout.
    elapsed_s: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.failed and not self.lagging


@dataclass(slots=True)
class _Generator:
    seen_at: float
    version: int | None = None
    failed_version: int | None = None
    error: str | None = None


class AckBook:
    """What each generator last said about its weights."""

    def __init__(self, service: str, live_after_s: float) -> None:
        self.service = service
        self.live_after_s = live_after_s
        self._generators: dict[str, _Generator] = {}

    def heard(self, beat: Heartbeat, now: float) -> None:
        if beat.service != self.service:
            return
        if beat.state is ServiceState.STOPPED:
            self._generators.pop(beat.instance, None)
            return
        generator = self._touch(beat.instance, now)
        generator.version = _newest(generator.version, beat.policy_version)

    def acked(self, ack: WeightSyncAck, now: float) -> None:
        if ack.service != self.service:
            return
        generator = self._touch(ack.instance, now)
        if ack.ok:
            generator.version = _newest(generator.version, ack.version)
        elif ack.version >= (generator.failed_version or 0):
            generator.failed_version = ack.version
            generator.error = ack.error or "failed without a reason"

    def _touch(self, instance: str, now: float) -> _Generator:
        generator = self._generators.get(instance)
        if generator is None:
            generator = self._generators[instance] = _Generator(seen_at=now)
        generator.seen_at = max(generator.seen_at, now)
        return generator

    def live(self, now: float) -> list[str]:
        cutoff = now - self.live_after_s
        return sorted(i for i, g in self._generators.items() if g.seen_at >= cutoff)

    def settled(self, version: int, now: float) -> bool:
        """Every live generator has acked ``version`` or failed to load it."""
        return not self.round(version, now).lagging

    def round(self, version: int, now: float, elapsed_s: float = 0.0) -> AckRound:
        acked, failed, lagging = [], [], []
        for instance in self.live(now):
            generator = self._generators[instance]
            report = GeneratorReport(instance, generator.version)
            if generator.version is not None and generator.version >= version:
                acked.append(report)
            elif generator.failed_version is not None and generator.failed_version >= version:
                failed.append(GeneratorReport(instance, generator.version, generator.error))
            else:
                lagging.append(report)
        return AckRound(
            version=version,
            acked=tuple(acked),
            failed=tuple(failed),
            lagging=tuple(lagging),
            elapsed_s=elapsed_s,
        )

    def forget_silent(self, now: float, after_s: float) -> None:
        """Drop generators silent for ``after_s``: the book stays as small as the fleet."""
        for instance, generator in list(self._generators.items()):
            if now - generator.seen_at > after_s:
                del self._generators[instance]


def _newest(known: int | None, reported: int | None) -> int | None:
    if reported is None:
        return known
    return reported if known is None else max(known, reported)


class WeightAcks:
    """Collects rounds of acks; owned by the learner service, which subscribes it
    (:meth:`listen`), runs :meth:`run` among its background tasks and calls
    :meth:`announced` after each PolicyUpdate."""

    def __init__(self, settings: AckSettings, log: structlog.typing.FilteringBoundLogger) -> None:
        self.settings = settings
        self.book = AckBook(settings.service, settings.live_after_s)
        self.last: AckRound | None = None
        self.rounds = 0
        self.incomplete = 0
        self._log = log
        self._changed = asyncio.Event()
        #: The newest announced version not yet collected; one slot, so never more than one
        #: round waits: versions announced meanwhile are covered by the newest.
        self._wanted: int | None = None
        self._wanted_set = asyncio.Event()
        self._requested = -1

    def listen(self, service: Service) -> None:
        """Subscribe through ``service`` (call from its ``setup``)."""
        ack_subject = subjects.weight_ack(self.settings.service)
        service.listen(ack_subject, Codec(WeightSyncAck), self._on_ack)
        service.listen(subjects.heartbeats(), Codec(Heartbeat), self._on_heartbeat)

    async def _on_ack(self, ack: WeightSyncAck, _: Request) -> None:
        self.ack_received(ack)

    async def _on_heartbeat(self, beat: Heartbeat, _: Request) -> None:
        self.heartbeat_received(beat)

    def ack_received(self, ack: WeightSyncAck) -> None:
        self.book.acked(ack, time.monotonic())
        self._poke()

    def heartbeat_received(self, beat: Heartbeat) -> None:
        self.book.heard(beat, time.monotonic())
        self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def collect(self, version: int, timeout_s: float) -> AckRound:
        """Wait until every live generator acked ``version`` or failed, for up to ``timeout_s``."""
        started = time.monotonic()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while True:
                    changed = self._changed
                    if self.book.settled(version, time.monotonic()):
                        break
                    await changed.wait()
        now = time.monotonic()
        return self.book.round(version, now, elapsed_s=now - started)

    def announced(self, version: int) -> None:
        """A PolicyUpdate for ``version`` went out: collect its acks (never blocks)."""
        if version <= self._requested:
            return  # re-announced: its round ran or is running
        self._requested = version
        self._wanted = version
        self._wanted_set.set()

    async def run(self) -> None:
        """One round after another, for the newest version announced."""
        while True:
            await self._wanted_set.wait()
            self._wanted_set.clear()
            version = self._wanted
            if version is None:
                continue
            self._wanted = None
            self._record(await self.collect(version, self.settings.timeout_s))

    def _record(self, done: AckRound) -> None:
        self.last = done
        self.rounds += 1
        self.book.forget_silent(time.monotonic(), 4 * self.settings.live_after_s)
        lagging = {r.instance: r.version for r in done.lagging}
        failed = {r.instance: r.error for r in done.failed}
        if done.complete:
            self._log.info("weights_acked", version=done.version, generators=len(done.acked))
            return
        self.incomplete += 1
        self._log.warning("weights_not_acked", version=done.version, lagging=lagging, failed=failed)

    def statistics(self) -> dict[str, float]:
        values = {
            "generators_live": float(len(self.book.live(time.monotonic()))),
            "weight_ack_rounds": float(self.rounds),
            "weight_ack_incomplete": float(self.incomplete),
        }
        last = self.last
        if last is not None:
            values["weight_ack_version"] = float(last.version)
            values["weight_ack_s"] = last.elapsed_s
            values["generators_acked"] = float(len(last.acked))
            values["generators_lagging"] = float(len(last.lagging))
            values["generators_failed"] = float(len(last.failed))
        return values
