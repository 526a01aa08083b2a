"""Sessions scored by a domain's validators: ``POST /v1/temper/sessions/{name}/problem``
hands the agent a problem of a domain (its messages, never its answer key) and binds it
to the session; closing the session then sends its trajectories to the validators as
rollouts of that problem, and they score them like any other (docs/gateway.md).

The answer key stays in the gateway's memory and travels only in the rollouts' task to
the validators: the agent sees the question, as the policy does in any task.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from protocol.messages import Task
from protocol.packed import pack_i32
from services.domains import Domain, DomainError, Problem
from services.domains.registry import DomainRegistry
from services.gateway.errors import ApiError
from services.gateway.requests import decode_body
from services.gateway.sessions import Owner, Session, SessionError, SessionStore

#: ``Task.metadata["source"]`` of a validated session's task.
SOURCE = "gateway"


@dataclass(frozen=True, kw_only=True)
class BoundProblem:
    """The problem a session answers, and the domain whose validators score it."""

    domain: Domain
    problem: Problem

    def task(self, session: Session) -> Task:
        """The task of the session's rollouts: the domain's task for the problem (its
        answer key in the metadata, for the validators), with the session's id, tenant,
        first prompt ids and one sample per trajectory."""
        base = self.domain.task(self.problem, "train", 0, 0)
        first = session.trajectories[0]
        return msgspec.structs.replace(
            base,
            id=session.id,
            tenant=session.owner.tenant,
            prompt=[],
            prompt_tokens=pack_i32(first.prompt),
            n=len(session.trajectories),
            max_turns=max(base.max_turns, *(t.calls for t in session.trajectories)),
            metadata={
                **base.metadata,
                "source": SOURCE,
                "api_key": session.owner.key_id,
                "calls": session.calls,
            },
        )


class ProblemRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    domain: str


_DECODER = msgspec.json.Decoder(ProblemRequest)


class Problems:
    """Draws each domain's train problems in turn, one per bound session."""

    def __init__(
        self,
        registry: DomainRegistry,
        sessions: SessionStore,
        clock: Callable[[], float],
        seed: int = 0,
    ) -> None:
        self._registry = registry
        self._sessions = sessions
        self._clock = clock
        self._seed = seed
        self._draws: dict[str, Iterator[Problem]] = {}
        self.bound = 0

    def bind(self, owner: Owner, name: str, body: bytes) -> dict[str, Any]:
        """Open the session ``name`` (if it is not open) on a new problem of the domain
        the body names; what the agent is told of it."""
        domain = self._domain(decode_body(body, _DECODER).domain)
        try:
            session = self._sessions.open(owner, name, self._clock())
        except SessionError as error:
            raise ApiError(429, str(error), code="session_limit") from None
        if session.problem is not None or session.calls:
            raise ApiError(
                409,
                f"session {name!r} already has {'a problem' if session.problem else 'calls'}: "
                "a problem is bound before the session's first call, once",
                param="session",
                code="session_started",
            )
        problem = self._next(domain)
        session.problem = BoundProblem(domain=domain, problem=problem)
        self.bound += 1
        messages = domain.prompt.messages(problem.question)
        return {
            "object": "temper.problem",
            "session": name,
            "domain": domain.name,
            "problem": problem.key,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "tools": list(domain.tools),
        }

    def _domain(self, name: str) -> Domain:
        if name not in self._registry:
            known = ", ".join(self._registry.names()[:20])
            raise ApiError(
                404, f"no domain {name!r} (known: {known})", param="domain", code="unknown_domain"
            )
        return self._registry.get(name)

    def _next(self, domain: Domain) -> Problem:
        draws = self._draws.get(domain.name)
        if draws is None:
            draws = self._draws[domain.name] = _endless(domain, self._seed)
        try:
            return next(draws)
        except (StopIteration, DomainError):
            raise ApiError(
                409,
                f"domain {domain.name!r} has no train problems to hand out",
                param="domain",
                code="no_problems",
            ) from None


def _endless(domain: Domain, seed: int) -> Iterator[Problem]:
    """The domain's train problems in draw order, one pass after another."""
    for round_ in itertools.count():
        found = False
        for problem in domain.drawn(1000, "train", seed + round_):
            found = True
            yield problem
        if not found:
            return
