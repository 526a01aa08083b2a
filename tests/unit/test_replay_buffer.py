"""The replay buffer alone: whole groups, staleness, exclusions, weights, duplicates."""

from __future__ import annotations

from protocol.messages import (
    ChatMessage,
    Rollout,
    RolloutStatus,
    ScoredRollout,
    ScoreStatus,
    Segment,
    Task,
)
from protocol.packed import pack_f32, pack_i32, pack_u8
from services.replay.buffer import ReplayBuffer


def scored(
    task_id: str,
    index: int,
    *,
    n: int = 2,
    version: int = 0,
    domain: str = "arith",
    status: ScoreStatus = ScoreStatus.SCORED,
    split: str = "train",
) -> ScoredRollout:
    prompt = [ChatMessage(role="user", content="q")]
    task = Task(id=task_id, domain=domain, prompt=prompt, n=n, metadata={"split": split})
    rollout = Rollout(
        id=f"{task_id}/{index}",
        task=task,
        sample_index=index,
        tokens=pack_i32([1, 2, 3]),
        prompt_len=2,
        logprobs=pack_f32([-0.5]),
        loss_mask=pack_u8([1]),
        segments=[Segment(start=0, end=1, version=version)],
        status=RolloutStatus.OK if status is ScoreStatus.SCORED else RolloutStatus.INFRA_FAILURE,
    )
    return ScoredRollout(id=rollout.id, rollout=rollout, reward=float(index), status=status)


class Released:
    def __init__(self) -> None:
        self.ids: list[str] = []

    def hook(self, rollout_id: str):  # type: ignore[no-untyped-def]
        return lambda: self.ids.append(rollout_id)


def fill(buffer: ReplayBuffer, items: list[ScoredRollout], released: Released) -> None:
    for item in items:
        buffer.add(item, released.hook(item.id), now=0.0)


def take(buffer: ReplayBuffer, **overrides: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {
        "learner_version": 0,
        "max_staleness": 4,
        "max_samples": 100,
        "whole_groups": True,
        "domain_weights": {},
        "now": 1.0,
    }
    args.update(overrides)
    return buffer.take(**args)  # type: ignore[arg-type]


def test_only_complete_groups_are_served_and_released_on_serving() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    fill(buffer, [scored("a", 0), scored("a", 1), scored("b", 0)], released)
    selection = take(buffer)
    assert sorted(s.id for s in selection.items) == ["a/0", "a/1"]
    assert sorted(released.ids) == ["a/0", "a/1"]
    assert selection.remaining == 1 and len(buffer) == 1


def test_incomplete_group_is_served_after_the_group_timeout() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    fill(buffer, [scored("b", 0)], released)
    assert take(buffer, now=30.0).items == []
    assert [s.id for s in take(buffer, now=61.0).items] == ["b/0"]


def test_stale_samples_are_dropped_counted_and_released() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    fill(buffer, [scored("old", 0, version=1), scored("old", 1, version=1)], released)
    fill(buffer, [scored("new", 0, version=5), scored("new", 1, version=5)], released)
    selection = take(buffer, learner_version=6, max_staleness=2)
    assert [s.rollout.task.id for s in selection.items] == ["new", "new"]
    assert selection.dropped_stale == 2
    assert sorted(released.ids) == ["new/0", "new/1", "old/0", "old/1"]
    assert buffer.counts.dropped_stale == 2


def test_infra_failures_never_reach_the_learner_but_are_released() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    fill(
        buffer,
        [scored("g", 0), scored("g", 1, status=ScoreStatus.INFRA_FAILURE), scored("g", 2)],
        released,
    )
    buffer2 = ReplayBuffer(group_timeout_s=60)
    fill(buffer2, [scored("h", 0, n=1, status=ScoreStatus.INFRA_FAILURE)], released)
    selection = take(buffer)
    assert [s.id for s in selection.items] == ["g/0", "g/2"]
    assert "g/1" in released.ids and buffer.counts.excluded == selection.excluded == 1
    alone = take(buffer2)
    assert alone.items == [] and "h/0" in released.ids and len(buffer2) == 0
    assert alone.excluded == 1


def test_heldout_rollouts_are_never_held_or_served() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    heldout = [scored("e", 0, split="eval"), scored("e", 1, split="eval")]
    assert not any(buffer.add(item, released.hook(item.id), now=0.0) for item in heldout)
    fill(buffer, [scored("t", 0), scored("t", 1)], released)
    assert [s.rollout.task.id for s in take(buffer).items] == ["t", "t"]
    assert buffer.counts.heldout == 2 and buffer.statistics()["heldout"] == 2.0


def test_whole_groups_are_never_split_and_max_samples_holds() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    fill(buffer, [scored("a", i, n=3) for i in range(3)], released)
    fill(buffer, [scored("b", i, n=2) for i in range(2)], released)
    selection = take(buffer, max_samples=4)
    assert [s.id for s in selection.items] == ["a/0", "a/1", "a/2"] or [
        s.id for s in selection.items
    ] == ["b/0", "b/1"]
    assert len(selection.items) <= 4
    loose = take(buffer, max_samples=1, whole_groups=False)
    assert len(loose.items) == 1


def test_duplicates_and_late_redeliveries_are_not_held_twice() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    item = scored("d", 0, n=1)
    assert buffer.add(item, released.hook(item.id))
    assert not buffer.add(item, released.hook(item.id))
    assert [s.id for s in take(buffer).items] == ["d/0"]
    assert not buffer.add(item, released.hook(item.id))  # served already: not again
    assert buffer.counts.duplicates == 2


def test_domain_weights_choose_the_domain() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    for i in range(5):
        fill(buffer, [scored(f"m{i}", 0, n=1, domain="math")], released)
        fill(buffer, [scored(f"c{i}", 0, n=1, domain="code")], released)
    selection = take(buffer, max_samples=5, domain_weights={"code": 1.0, "math": 0.0})
    assert {s.rollout.task.domain for s in selection.items} == {"code"}
    assert len(selection.items) == 5


def test_payload_budget_stops_the_batch() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    fill(buffer, [scored(f"t{i}", 0, n=1) for i in range(5)], released)
    budget = iter([True, True, False])
    selection = take(buffer, fits=lambda _: next(budget, False))
    assert len(selection.items) == 2 and len(buffer) == 3


def test_available_counts_what_take_could_serve_without_taking_it() -> None:
    buffer = ReplayBuffer(group_timeout_s=60.0)
    for item in (scored("a", 0), scored("a", 1), scored("b", 0), scored("c", 0, version=0)):
        buffer.add(item, lambda: None, now=0.0)
    buffer.add(scored("c", 1, version=3), lambda: None, now=0.0)
    fresh = {"learner_version": 3, "max_staleness": 1, "now": 1.0}
    # a: complete but stale; b: incomplete; c: complete, one member stale.
    assert buffer.available(whole_groups=True, **fresh) == 1
    assert buffer.available(whole_groups=False, **fresh) == 1
    assert buffer.available(learner_version=0, max_staleness=0, whole_groups=True, now=1.0) == 4
    assert len(buffer) == 5


def test_a_leased_batch_is_acked_only_by_its_commit() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    fill(buffer, [scored("a", 0), scored("a", 1), scored("b", 0), scored("b", 1)], released)
    served = take(buffer, max_samples=2, lease=True)
    ids = [item.id for item in served.items]
    assert len(ids) == 2 and released.ids == []
    assert buffer.leased == 2 and len(buffer) == 2
    assert buffer.commit([*ids, "nobody/0"]) == (2, 1)
    assert sorted(released.ids) == sorted(ids)
    assert buffer.commit(ids) == (0, 2), "a second commit of the same ids acks nothing"
    assert buffer.statistics()["committed"] == 2.0


def test_released_leases_are_served_again_as_whole_groups() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    items = [
        scored("a", 0, n=3),
        scored("a", 1, n=3),
        scored("a", 2, n=3, status=ScoreStatus.INFRA_FAILURE),
    ]
    fill(buffer, items, released)
    first = take(buffer, max_samples=8, lease=True)
    assert [i.id for i in first.items] == ["a/0", "a/1"]
    assert released.ids == ["a/2"], "the infra failure is acked, never leased"
    assert buffer.release_leases() == 2
    # The group lost its infra-failed member for good: it must not wait for it again.
    again = take(buffer, max_samples=8, lease=True)
    assert sorted(i.id for i in again.items) == ["a/0", "a/1"]
    assert released.ids == ["a/2"]
    assert buffer.statistics()["released"] == 2.0


def test_a_commit_takes_a_redelivered_rollout_out_of_the_buffer() -> None:
    """After a restart of the replay service, what the learner trained comes back
    unacked; its commit acks it instead of letting it be served again."""
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    fill(buffer, [scored("a", 0), scored("a", 1)], released)
    assert buffer.commit(["a/0"]) == (1, 0)
    assert released.ids == ["a/0"]
    served = take(buffer, max_samples=8, whole_groups=False)
    assert [i.id for i in served.items] == ["a/1"]


def test_a_leased_rollout_redelivered_is_not_held_twice() -> None:
    buffer, released = ReplayBuffer(group_timeout_s=60), Released()
    fill(buffer, [scored("a", 0), scored("a", 1)], released)
    take(buffer, max_samples=8, lease=True)
    assert not buffer.add(scored("a", 0), released.hook("a/0"))
    assert buffer.counts.duplicates == 1
