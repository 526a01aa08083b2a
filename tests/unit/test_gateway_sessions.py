"""Gateway sessions: the token-level continuation rule, masking, expiry, and a closed
session as Rollouts, token by token."""

from __future__ import annotations

import itertools

import pytest

from protocol.codec import Codec, encode
from protocol.errors import SubjectError
from protocol.messages import FinishReason, Rollout, Segment
from protocol.packed import i32_list
from services.gateway.rollouts import SOURCE, session_task, to_rollouts
from services.gateway.sessions import (
    SESSION_HEADER,
    BadSessionName,
    Call,
    Completion,
    Owner,
    SessionFull,
    SessionStore,
    TooManySessions,
    session_name,
)

ALICE = Owner(key_id="k-alice", tenant="acme", timeout_s=60.0)
BOB = Owner(key_id="k-bob", tenant="acme", timeout_s=60.0)
SYSTEM = [1, 2, 3]
C1 = [10, 11, 12]
TOOL = [20, 21]
C2 = [30, 31]


def call(prompt: list[int], *completions: list[int], version: int = 0) -> Call:
    choices = [
        Completion(ids=ids, logprobs=[-0.5 - i for i in range(len(ids))], text=f"text{ids[0]}")
        for ids in completions
    ]
    return Call(prompt=prompt, choices=choices, version=version)


def store(**bounds: int) -> SessionStore:
    ids = (f"gw-{i}" for i in itertools.count())
    return SessionStore(
        max_sessions=bounds.get("max_sessions", 100),
        max_trajectories=bounds.get("max_trajectories", 8),
        max_staleness=bounds.get("max_staleness", 0),
        new_id=lambda: next(ids),
    )


def test_the_header_names_the_session_else_the_user_field() -> None:
    assert session_name("s1", "alice") == "s1"
    assert session_name(None, "alice") == "alice"
    assert session_name(None, None) is None
    for header, user, source in [(" ", None, SESSION_HEADER), (None, "x" * 300, "user")]:
        with pytest.raises(BadSessionName) as caught:
            session_name(header, user)
        assert caught.value.source == source
    with pytest.raises(BadSessionName):
        session_name("a\nb", None)


def test_a_prompt_that_extends_the_last_call_token_for_token_continues_it() -> None:
    sessions = store()
    first = sessions.record(ALICE, "s", call(SYSTEM, C1, version=3), now=0.0)
    second = sessions.record(ALICE, "s", call(SYSTEM + C1 + TOOL, C2, version=4), now=1.0)
    assert (first.trajectories, first.continued) == ((0,), False)
    assert (second.trajectories, second.continued) == ((0,), True)
    assert second.session_id == first.session_id
    session = sessions.get(ALICE.key_id, "s")
    assert session is not None and len(session.trajectories) == 1 and session.calls == 2
    trajectory = session.trajectories[0]
    assert trajectory.prompt == SYSTEM
    assert trajectory.completion == C1 + TOOL + C2
    # Completions are trained, the tool result between them is masked out.
    assert trajectory.mask == [1, 1, 1, 0, 0, 1, 1]
    assert trajectory.logprobs == [-0.5, -1.5, -2.5, 0.0, 0.0, -0.5, -1.5]
    assert trajectory.segments == [
        Segment(start=0, end=3, kind="gen", version=3),
        Segment(start=3, end=5, kind="tool"),
        Segment(start=5, end=7, kind="gen", version=4),
    ]
    assert (trajectory.calls, trajectory.text) == (2, "text30")


def test_a_trajectory_too_stale_to_train_is_not_continued_a_new_one_starts() -> None:
    sessions = store(max_staleness=2)
    sessions.record(ALICE, "s", call(SYSTEM, C1, version=3), now=0.0)
    # Two versions on: still within the bound, the trajectory goes on.
    assert sessions.record(ALICE, "s", call(SYSTEM + C1 + TOOL, C2, version=5), now=1.0).continued
    session = sessions.get(ALICE.key_id, "s")
    assert session is not None and session.trajectories[0].oldest_version == 3
    # Three versions past its oldest turn: the learner would drop it whole.
    prompt = SYSTEM + C1 + TOOL + C2 + TOOL
    late = sessions.record(ALICE, "s", call(prompt, [40], version=6), now=2.0)
    assert (late.continued, late.trajectories) == (False, (1,))
    fresh = session.trajectories[1]
    # The earlier turns are its prompt, context only; what it trains on is this call's.
    assert (fresh.prompt, fresh.completion, fresh.mask) == (prompt, [40], [1])
    assert session.continued([*prompt, 40, 7], version=6, max_staleness=2) == 1
    assert session.continued([*prompt, 40, 7], version=6) == 1  # no bound: longest fits


def test_a_prompt_equal_to_the_last_prompt_plus_completion_continues_without_a_gap() -> None:
    sessions = store()
    sessions.record(ALICE, "s", call(SYSTEM, C1), now=0.0)
    recorded = sessions.record(ALICE, "s", call(SYSTEM + C1, C2), now=1.0)
    session = sessions.get(ALICE.key_id, "s")
    assert recorded.continued and session is not None
    assert [s.kind for s in session.trajectories[0].segments] == ["gen", "gen"]
    assert session.trajectories[0].mask == [1] * 5


@pytest.mark.parametrize(
    "prompt",
    [
        [*SYSTEM, 10, 99, 12, *TOOL],  # an earlier completion re-tokenized differently
        [1, 2, 4, *C1, *TOOL],  # the system prompt rewritten
        SYSTEM + C1[:2],  # shorter than what the trajectory holds
        SYSTEM + TOOL,  # the completion dropped from the history
    ],
)
def test_a_rewritten_history_starts_a_new_trajectory_in_the_same_session(prompt: list[int]) -> None:
    sessions = store()
    first = sessions.record(ALICE, "s", call(SYSTEM, C1), now=0.0)
    second = sessions.record(ALICE, "s", call(prompt, C2), now=1.0)
    assert (second.trajectories, second.continued) == ((1,), False)
    assert second.session_id == first.session_id
    session = sessions.get(ALICE.key_id, "s")
    assert session is not None
    new = session.trajectories[1]
    # The whole new prompt is prompt (no loss on it); the first trajectory is untouched.
    assert (new.prompt, new.completion, new.mask) == (prompt, C2, [1, 1])
    assert session.trajectories[0].completion == C1


def test_interleaved_conversations_each_continue_their_own_trajectory() -> None:
    sessions = store()
    other = [7, 8]
    sessions.record(ALICE, "s", call(SYSTEM, C1), now=0.0)
    sessions.record(ALICE, "s", call(other, [40]), now=0.1)
    a = sessions.record(ALICE, "s", call(SYSTEM + C1 + TOOL, C2), now=0.2)
    b = sessions.record(ALICE, "s", call([*other, 40, 41], [42]), now=0.3)
    assert (a.trajectories, a.continued, b.trajectories, b.continued) == ((0,), True, (1,), True)


def test_the_longest_trajectory_that_fits_is_continued() -> None:
    sessions = store()
    sessions.record(ALICE, "s", call([1, 2, 3], [10]), now=0.0)
    # History cut back to [1, 2]: a new trajectory, whose tokens happen to run past the first's.
    sessions.record(ALICE, "s", call([1, 2], [3, 10, 11]), now=0.1)
    # Both [1, 2, 3, 10] and [1, 2, 3, 10, 11] are prefixes: the longer proves more.
    both = sessions.record(ALICE, "s", call([1, 2, 3, 10, 11, 20], [21]), now=0.2)
    assert (both.trajectories, both.continued) == ((1,), True)
    session = sessions.get(ALICE.key_id, "s")
    assert session is not None and session.trajectories[0].completion == [10]


def test_several_choices_fork_the_trajectory() -> None:
    sessions = store()
    sessions.record(ALICE, "s", call(SYSTEM, C1), now=0.0)
    recorded = sessions.record(ALICE, "s", call(SYSTEM + C1 + TOOL, C2, [50]), now=1.0)
    assert (recorded.trajectories, recorded.continued) == ((0, 1), True)
    session = sessions.get(ALICE.key_id, "s")
    assert session is not None
    assert session.trajectories[0].completion == C1 + TOOL + C2
    assert session.trajectories[1].completion == C1 + TOOL + [50]
    assert session.trajectories[1].mask == [1, 1, 1, 0, 0, 1]
    # Each choice of the next call goes on from its own branch.
    again = sessions.record(ALICE, "s", call(SYSTEM + C1 + TOOL + [50, 60], [61]), now=2.0)
    assert again.trajectories == (1,)


def test_sessions_are_scoped_to_the_key() -> None:
    sessions = store()
    a = sessions.record(ALICE, "s", call(SYSTEM, C1), now=0.0)
    b = sessions.record(BOB, "s", call(SYSTEM + C1 + TOOL, C2), now=0.0)
    assert a.session_id != b.session_id and not b.continued
    assert len(sessions) == 2


def test_an_idle_session_expires_dropped_and_counted() -> None:
    sessions = store()
    first = sessions.record(ALICE, "s", call(SYSTEM, C1), now=0.0)
    sessions.record(ALICE, "s", call(SYSTEM + C1 + TOOL, C2), now=50.0)
    assert sessions.expire(now=100.0) == 0  # idle 50 s of 60: still open
    assert sessions.expire(now=110.0) == 1
    assert sessions.get(ALICE.key_id, "s") is None
    assert sessions.close(ALICE.key_id, "s") is None  # nothing left to train on
    stats = sessions.statistics()
    assert (stats["sessions_expired"], stats["calls_expired"], stats["sessions_open"]) == (1, 2, 0)
    # The name is free again: a later call opens a new session under a new id.
    again = sessions.record(ALICE, "s", call(SYSTEM + C1 + TOOL, C2), now=111.0)
    assert again.session_id != first.session_id and not again.continued


def test_a_call_after_the_timeout_does_not_continue_the_expired_session() -> None:
    sessions = store()
    first = sessions.record(ALICE, "s", call(SYSTEM, C1), now=0.0)
    late = sessions.record(ALICE, "s", call(SYSTEM + C1 + TOOL, C2), now=60.0)
    assert late.session_id != first.session_id and not late.continued
    assert sessions.statistics()["sessions_expired"] == 1


def test_a_closed_session_is_taken_out_once() -> None:
    sessions = store()
    sessions.record(ALICE, "s", call(SYSTEM, C1), now=0.0)
    closed = sessions.close(ALICE.key_id, "s")
    assert closed is not None and closed.calls == 1
    assert sessions.close(ALICE.key_id, "s") is None
    assert sessions.statistics()["sessions_closed"] == 1


def test_the_store_and_each_session_are_bounded() -> None:
    sessions = store(max_sessions=1, max_trajectories=2)
    sessions.record(ALICE, "s", call(SYSTEM, C1), now=0.0)
    with pytest.raises(TooManySessions):
        sessions.record(BOB, "s", call(SYSTEM, C1), now=1.0)
    sessions.record(BOB, "s", call(SYSTEM, C1), now=61.0)  # Alice's expired: room again
    with pytest.raises(SessionFull):
        sessions.record(BOB, "s", call([9], [1], [2]), now=62.0)
    session = sessions.get(BOB.key_id, "s")
    assert session is not None and len(session.trajectories) == 1


def test_a_call_must_be_whole() -> None:
    with pytest.raises(ValueError, match="log-probabilities"):
        Completion(ids=[1, 2], logprobs=[0.0])
    with pytest.raises(ValueError, match="choice"):
        Call(prompt=[1], choices=[], version=0)
    with pytest.raises(ValueError, match="prompt"):
        Call(prompt=[], choices=[Completion(ids=[], logprobs=[])], version=0)


# ---------------------------------------------------------------- rollouts


def test_a_closed_session_becomes_rollouts_token_by_token() -> None:
    sessions = store()
    sessions.record(ALICE, "s", call(SYSTEM, C1, version=3), now=0.0)
    sessions.record(ALICE, "s", call(SYSTEM + C1 + TOOL, C2, version=4), now=1.0)
    sessions.record(ALICE, "s", call([9, 9], [70], version=4), now=2.0)  # history rewritten
    closed = sessions.close(ALICE.key_id, "s")
    assert closed is not None
    task = session_task(closed, domain="agents", tier=2)
    rollouts = to_rollouts(closed, task=task, created_at=1234.5)
    assert [r.id for r in rollouts] == ["gw-0/0", "gw-0/1"]
    first, second = rollouts
    task = first.task
    assert (task.id, task.domain, task.tenant, task.tier, task.n) == (
        "gw-0",
        "agents",
        "acme",
        2,
        2,
    )
    assert task.metadata["source"] == SOURCE and task.max_turns == 2
    assert first.sample_index == 0 and second.sample_index == 1
    assert i32_list(first.tokens) == SYSTEM + C1 + TOOL + C2
    assert first.prompt_len == len(SYSTEM)
    assert first.completion_ids.tolist() == C1 + TOOL + C2
    assert first.mask.tolist() == [1, 1, 1, 0, 0, 1, 1]
    assert first.behaviour_logprobs.tolist() == [-0.5, -1.5, -2.5, 0.0, 0.0, -0.5, -1.5]
    assert [(s.start, s.end, s.kind, s.version) for s in first.segments] == [
        (0, 3, "gen", 3),
        (3, 5, "tool", None),
        (5, 7, "gen", 4),
    ]
    assert first.policy_version == 3  # staleness counts from the oldest segment
    assert (first.completion_text, first.finish_reason, first.created_at) == (
        "text30",
        FinishReason.STOP,
        1234.5,
    )
    assert (i32_list(second.tokens), second.prompt_len, second.mask.tolist()) == (
        [9, 9, 70],
        2,
        [1],
    )
    # They are valid v1 messages: they survive the wire with every constraint checked.
    for rollout in rollouts:
        assert Codec(Rollout).decode(encode(rollout)) == rollout


def test_rollouts_need_a_domain_the_stack_can_route() -> None:
    sessions = store()
    sessions.record(ALICE, "s", call(SYSTEM, C1), now=0.0)
    closed = sessions.close(ALICE.key_id, "s")
    assert closed is not None
    with pytest.raises(SubjectError):
        session_task(closed, domain="no spaces")
    with pytest.raises(SubjectError):
        session_task(closed, domain="agents", tier=7)
