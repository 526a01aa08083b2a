"""Weight acks without a server: which live generators acked a version, failed, or lag."""

from __future__ import annotations

import asyncio
import time

import structlog

from protocol.messages import Heartbeat, ServiceState, WeightSyncAck
from services.learner.acks import AckBook, AckSettings, GeneratorReport, WeightAcks

LIVE_S = 10.0


def beat(
    instance: str,
    version: int | None,
    *,
    service: str = "generator",
    state: ServiceState = ServiceState.RUNNING,
) -> Heartbeat:
    return Heartbeat(
        service=service, instance=instance, state=state, healthy=True, policy_version=version
    )


def ack(instance: str, version: int, error: str | None = None) -> WeightSyncAck:
    return WeightSyncAck(
        version=version, service="generator", instance=instance, ok=error is None, error=error
    )


def test_live_generators_are_sorted_into_acked_failed_and_lagging() -> None:
    book = AckBook("generator", LIVE_S)
    for name, version in (("a", 4), ("b", 4), ("c", 4), ("d", 9)):
        book.heard(beat(name, version), now=100.0)
    book.acked(ack("a", 5), now=101.0)
    book.acked(ack("b", 5, error="ValueError: digest mismatch"), now=101.0)

    done = book.round(5, now=102.0)

    # d serves a newer version than the round's: it needs no ack of its own.
    assert done.acked == (GeneratorReport("a", 5), GeneratorReport("d", 9))
    assert done.failed == (GeneratorReport("b", 4, "ValueError: digest mismatch"),)
    assert done.lagging == (GeneratorReport("c", 4),)
    assert not done.complete
    assert not book.settled(5, now=102.0)
    book.heard(beat("c", 5), now=103.0)  # the heartbeat alone tells it serves v5
    assert book.settled(5, now=103.0)


def test_a_failure_of_an_older_version_does_not_excuse_a_newer_one() -> None:
    book = AckBook("generator", LIVE_S)
    book.acked(ack("a", 3, error="OSError: gone"), now=0.0)
    assert book.round(3, now=0.0).failed == (GeneratorReport("a", None, "OSError: gone"),)
    assert book.round(4, now=0.0).lagging == (GeneratorReport("a", None),)


def test_only_live_generators_of_the_service_count() -> None:
    book = AckBook("generator", LIVE_S)
    book.heard(beat("old", 1), now=0.0)
    book.heard(beat("learner-1", None, service="learner"), now=20.0)
    book.heard(beat("new", 1), now=20.0)
    book.heard(beat("leaving", 1), now=20.0)
    book.heard(beat("leaving", 1, state=ServiceState.STOPPED), now=20.5)

    assert book.live(now=20.5) == ["new"]
    assert book.round(2, now=20.5).lagging == (GeneratorReport("new", 1),)
    book.forget_silent(now=20.5, after_s=5.0)
    book.heard(beat("old", None), now=21.0)  # back, silent about its version: it is new
    assert book.round(2, now=21.0).lagging == (
        GeneratorReport("new", 1),
        GeneratorReport("old", None),
    )


def test_versions_only_move_forward_whatever_the_arrival_order() -> None:
    book = AckBook("generator", LIVE_S)
    book.acked(ack("a", 6), now=1.0)
    book.heard(beat("a", 5), now=0.5)  # an older heartbeat delivered after the ack
    assert book.round(6, now=1.0).acked == (GeneratorReport("a", 6),)


def acks(timeout_s: float = 5.0) -> WeightAcks:
    settings = AckSettings(timeout_s=timeout_s, live_after_s=LIVE_S)
    return WeightAcks(settings, structlog.get_logger())


async def test_collect_returns_within_its_timeout_when_a_generator_never_acks() -> None:
    weights = acks()
    weights.heartbeat_received(beat("quiet", 2))
    weights.heartbeat_received(beat("busy", 2))
    waiting = asyncio.create_task(weights.collect(3, timeout_s=0.3))
    await asyncio.sleep(0.05)
    weights.ack_received(ack("busy", 3))

    started = time.monotonic()
    done = await asyncio.wait_for(waiting, timeout=2.0)

    assert time.monotonic() - started < 0.5
    assert 0.3 <= done.elapsed_s < 0.5
    assert done.acked == (GeneratorReport("busy", 3),)
    assert done.lagging == (GeneratorReport("quiet", 2),)


async def test_collect_ends_as_soon_as_the_last_generator_answers() -> None:
    weights = acks()
    weights.heartbeat_received(beat("a", 0))
    weights.heartbeat_received(beat("b", 0))
    waiting = asyncio.create_task(weights.collect(1, timeout_s=30.0))
    await asyncio.sleep(0.02)
    weights.ack_received(ack("a", 1))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    weights.ack_received(ack("b", 1, error="TimeoutError: engine"))

    done = await asyncio.wait_for(waiting, timeout=1.0)

    assert done.elapsed_s < 1.0
    assert [r.instance for r in done.acked] == ["a"]
    assert [r.instance for r in done.failed] == ["b"]


async def test_rounds_run_in_the_background_for_the_newest_version() -> None:
    weights = acks(timeout_s=0.2)
    weights.heartbeat_received(beat("a", 0))
    weights.heartbeat_received(beat("lazy", 0))
    runner = asyncio.create_task(weights.run())
    try:
        weights.announced(1)
        weights.announced(2)  # before the round began: one round, for v2
        weights.announced(2)  # re-announced: nothing new
        weights.ack_received(ack("a", 2))
        async with asyncio.timeout(2.0):
            while weights.last is None:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
    finally:
        runner.cancel()
    assert weights.rounds == 1
    assert weights.last.version == 2
    assert weights.last.lagging == (GeneratorReport("lazy", 0),)
    figures = weights.statistics()
    assert figures["generators_live"] == 2
    assert figures["generators_lagging"] == 1
    assert figures["generators_acked"] == 1
    assert figures["weight_ack_incomplete"] == 1
    assert 0.2 <= figures["weight_ack_s"] < 0.5


async def test_with_no_live_generator_a_round_ends_at_once() -> None:
    done = await asyncio.wait_for(acks().collect(7, timeout_s=30.0), timeout=1.0)
    assert done.complete and done.acked == () and done.elapsed_s < 0.1
