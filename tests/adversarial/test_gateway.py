"""Cheats of an agent on a session its domain's validators score (the gateway's
problems): reading the answer key, choosing or re-drawing its problem, scoring itself.
Each is refused before anything reaches the bus, and the session stays as it was."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.domains import load_registry
from services.gateway.errors import ApiError
from services.gateway.problems import Problems
from services.gateway.rewards import Rewards
from services.gateway.sessions import SessionStore
from tests.unit.test_gateway_sessions import ALICE, call

DOMAIN = "arithmetic_sum4"


class NoBus:
    """Stands where the bus is: a refused cheat must publish nothing."""

    async def publish(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a refused request published to the bus")


def stack() -> tuple[SessionStore, Problems, Rewards]:
    sessions = SessionStore(max_sessions=8, max_trajectories=4)
    problems = Problems(load_registry(plugins=False), sessions, clock=lambda: 0.0)
    return sessions, problems, Rewards(NoBus(), sessions, "gateway")  # type: ignore[arg-type]


def bind(problems: Problems, name: str, body: object) -> dict[str, Any]:
    return problems.bind(ALICE, name, json.dumps(body).encode())


def refused(error: pytest.ExceptionInfo[ApiError]) -> tuple[int, str | None]:
    return error.value.status, error.value.code


def test_the_problem_the_agent_gets_holds_no_answer_key() -> None:
    sessions, problems, _ = stack()
    given = bind(problems, "s", {"domain": DOMAIN})
    session = sessions.get(ALICE.key_id, "s")
    assert session is not None and session.problem is not None
    key = session.problem.problem.metadata
    assert set(given) == {"object", "session", "domain", "problem", "messages", "tools"}
    text = json.dumps(given)
    assert "answer" not in {k for m in given["messages"] for k in m}
    assert f'"{key["answer"]}"' not in text and "metadata" not in text


def test_an_agent_can_neither_choose_nor_redraw_its_problem() -> None:
    sessions, problems, _ = stack()
    with pytest.raises(ApiError) as chosen:
        bind(problems, "s", {"domain": DOMAIN, "problem": "an easy one"})
    assert refused(chosen)[0] == 400 and sessions.get(ALICE.key_id, "s") is None
    bind(problems, "s", {"domain": DOMAIN})
    first = sessions.get(ALICE.key_id, "s")
    assert first is not None and first.problem is not None
    drawn = first.problem.problem.key
    with pytest.raises(ApiError) as again:
        bind(problems, "s", {"domain": DOMAIN})
    assert refused(again) == (409, "session_started")
    assert first.problem.problem.key == drawn
    # Nor bind one once it has seen how its calls went.
    sessions.record(ALICE, "late", call([1, 2], [3]), now=0.0)
    with pytest.raises(ApiError) as late:
        bind(problems, "late", {"domain": DOMAIN})
    assert refused(late) == (409, "session_started")
    with pytest.raises(ApiError) as unknown:
        bind(problems, "other", {"domain": "no_such_domain"})
    assert refused(unknown) == (404, "unknown_domain")


@pytest.mark.parametrize("body", [{"reward": 1.0}, {"rewards": [1.0]}])
async def test_an_agent_cannot_score_a_session_its_validators_score(body: object) -> None:
    sessions, problems, rewards = stack()
    bind(problems, "s", {"domain": DOMAIN})
    sessions.record(ALICE, "s", call([1, 2], [3]), now=0.0)
    with pytest.raises(ApiError) as scored:
        await rewards.close(ALICE.key_id, "s", json.dumps(body).encode())
    assert refused(scored) == (409, "scored_by_validators")
    session = sessions.get(ALICE.key_id, "s")
    assert session is not None and len(session.trajectories) == 1  # still open, untouched


async def test_a_session_without_a_problem_needs_its_reward() -> None:
    """An empty body closes only a session its validators score; any other needs a number."""
    sessions, _, rewards = stack()
    sessions.record(ALICE, "plain", call([1, 2], [3]), now=0.0)
    with pytest.raises(ApiError) as empty:
        await rewards.close(ALICE.key_id, "plain", b"{}")
    assert refused(empty) == (400, "invalid_value")
    assert sessions.get(ALICE.key_id, "plain") is not None
