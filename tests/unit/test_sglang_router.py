"""StickyRouter: which SGLang server serves a request (pure logic, no server)."""

from __future__ import annotations

import pytest

from services.engines.sglang.router import StickyRouter

A, B, C = "http://a", "http://b", "http://c"


def test_turns_of_a_trajectory_stick_to_their_first_server() -> None:
    router = StickyRouter([A, B])
    first = router.choose("t1")
    with router.lease("t2"), router.lease("t2"):
        # Even while its server is the busier one, t1 stays where its prefix is cached.
        assert all(router.choose("t1") == first for _ in range(5))


def test_new_trajectories_go_to_the_server_with_fewest_in_flight() -> None:
    router = StickyRouter([A, B, C])
    with router.lease("t1") as first, router.lease("t2") as second:
        assert {first, second} == {A, B}
        assert router.choose("t3") == C
    # Nothing in flight: ties go to fewer requests served, then to list order.
    assert router.choose("t4") == C


def test_lease_counts_in_flight_until_the_block_ends() -> None:
    router = StickyRouter([A, B])
    with router.lease("t1") as url:
        assert router.servers[url].in_flight == 1
        with pytest.raises(RuntimeError), router.lease("t1"):
            assert router.servers[url].in_flight == 2
            raise RuntimeError("request failed")
        assert router.servers[url].in_flight == 1
    assert router.servers[url].in_flight == 0
    assert router.servers[url].requests == 2


def test_requests_without_trajectory_are_not_remembered() -> None:
    router = StickyRouter([A, B])
    with router.lease(""), router.lease(""):
        pass
    assert len(router) == 0


def test_unhealthy_sticky_server_hands_the_trajectory_over() -> None:
    router = StickyRouter([A, B])
    assert router.choose("t1") == A
    router.mark(A, healthy=False)
    assert router.choose("t1") == B
    assert router.pinned("t1") == B
    router.mark(A, healthy=True)
    assert router.choose("t1") == B, "a trajectory moves at most once per failure"


def test_new_trajectories_avoid_unhealthy_servers() -> None:
    router = StickyRouter([A, B])
    router.mark(A, healthy=False)
    assert {router.choose(f"t{i}") for i in range(4)} == {B}


def test_all_unhealthy_still_chooses_a_server() -> None:
    router = StickyRouter([A, B])
    router.mark(A, healthy=False)
    router.mark(B, healthy=False)
    assert router.choose("t1") in (A, B)


def test_the_sticky_map_is_a_bounded_lru() -> None:
    router = StickyRouter([A, B], capacity=3)
    for tid in ("t1", "t2", "t3"):
        router.choose(tid)
    router.choose("t1")  # most recently used now
    router.choose("t4")  # evicts t2, the least recently used
    assert len(router) == 3
    assert router.pinned("t2") is None
    assert all(router.pinned(tid) is not None for tid in ("t1", "t3", "t4"))


def test_forget_drops_a_trajectory() -> None:
    router = StickyRouter([A])
    router.choose("t1")
    router.forget("t1")
    router.forget("never-seen")
    assert router.pinned("t1") is None


@pytest.mark.parametrize(
    ("urls", "capacity", "message"),
    [([], 10, "at least one server"), ([A, A], 10, "duplicate"), ([A], 0, "capacity")],
)
def test_bad_configuration_is_refused(urls: list[str], capacity: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StickyRouter(urls, capacity)
