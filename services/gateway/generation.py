"""A chat or completion call from request to answer: its prompt ids (extended token for
token within a session), one generation through the generators, the OpenAI answer, and
the session's record of what was generated (docs/gateway.md)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.messages import SamplingParams
from services.gateway import errors
from services.gateway.calls import CallRequest, Calls, CallTimeout
from services.gateway.keys import KeyPolicy
from services.gateway.prompts import (
    Answered,
    Prompter,
    TemplateMessage,
    assistant_text,
    forced_opening,
    template_messages,
    tools_key,
)
from services.gateway.requests import ChatCompletionRequest, CompletionRequest
from services.gateway.responses import Answer, Sample, samples_of
from services.gateway.sessions import (
    Call,
    Completion,
    Owner,
    SessionError,
    SessionStore,
)
from services.model.chat_template import TemplateTokenizer


@dataclass(frozen=True, kw_only=True)
class Served:
    """An answer: one JSON body, or the chunks of a stream."""

    body: dict[str, Any] | None = None
    chunks: list[dict[str, Any]] | None = None


@dataclass(frozen=True, kw_only=True)
class Limits:
    #: The model id answers name.
    model_id: str
    #: The domain a call is scheduled in (its tenant's share of it).
    domain: str
    #: The model's context, prompt and completion together.
    context: int
    #: Completion tokens when a request does not say.
    max_tokens: int
    #: Token ids go below this (the model's vocabulary).
    vocab: int


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """One call as the generators will see it, and where its record goes."""

    prompt: list[int]
    sampling: SamplingParams
    n: int
    session: str | None
    owner: Owner
    tools: bool
    #: The start of the turn a ``tool_choice`` forced (the prompt ends with its ids).
    opening: str = ""


class Generation:
    def __init__(
        self,
        *,
        tokenizer: TemplateTokenizer,
        calls: Calls,
        sessions: SessionStore,
        limits: Limits,
        version: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tokenizer = tokenizer
        self.prompter = Prompter(tokenizer)
        self.calls = calls
        self.sessions = sessions
        self.limits = limits
        self._version = version
        self._clock = clock

    async def chat(
        self, request: ChatCompletionRequest, key: KeyPolicy, session: str | None
    ) -> Served:
        # `none`: the model is not told of the tools, so it answers in text.
        offered = None if request.tool_choice == "none" else request.tools
        chat = template_messages(request.messages, offered, self.tokenizer)
        tools = tools_key(offered)
        owner = owner_of(key)
        prompt = self.prompter.prompt(chat, tools, self._answered(owner, session))
        opening = forced_opening(request.tool_choice)
        if opening:
            prompt = [*prompt, *self.tokenizer.encode(opening)]
        max_tokens = request.max_completion_tokens or request.max_tokens
        plan = _Plan(
            prompt=prompt,
            sampling=self._sampling(request, max_tokens, prompt, tools=bool(offered)),
            n=request.n,
            session=session,
            owner=owner,
            tools=bool(offered),
            opening=opening,
        )
        samples = await self._generate(plan, key)
        self._remember(plan, chat, tools, samples)
        answer = self._answer("chatcmpl", len(prompt), request.logprobs)
        if request.stream:
            return Served(chunks=answer.chat_chunks(samples))
        return Served(body=answer.chat(samples))

    async def completion(
        self, request: CompletionRequest, key: KeyPolicy, session: str | None
    ) -> Served:
        given = request.prompt
        prompt = list(given) if isinstance(given, list) else self.tokenizer.encode(given)
        if not prompt:
            raise errors.ApiError(400, "the prompt is empty", param="prompt", code="invalid_value")
        if max(prompt) >= self.limits.vocab:
            raise errors.ApiError(
                422,
                f"`prompt`: token id {max(prompt)} is outside the model's vocabulary "
                f"(ids below {self.limits.vocab})",
                param="prompt",
                code="invalid_value",
            )
        plan = _Plan(
            prompt=prompt,
            sampling=self._sampling(request, request.max_tokens, prompt, tools=False),
            n=request.n,
            session=session,
            owner=owner_of(key),
            tools=False,
        )
        samples = await self._generate(plan, key)
        answer = self._answer("cmpl", len(prompt), request.logprobs is not None)
        if request.stream:
            return Served(chunks=answer.completion_chunks(samples))
        return Served(body=answer.completion(samples))

    # ------------------------------------------------------------------ steps

    def _sampling(
        self,
        request: ChatCompletionRequest | CompletionRequest,
        max_tokens: int | None,
        prompt: list[int],
        *,
        tools: bool,
    ) -> SamplingParams:
        room = self.limits.context - len(prompt)
        wanted = max_tokens or min(self.limits.max_tokens, room)
        if wanted > room or room < 1:
            raise errors.context_exceeded(len(prompt), wanted, self.limits.context)
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        end = self.tokenizer.tool_call_end_id
        return SamplingParams(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            max_tokens=wanted,
            stop=stop,
            # With tools, a turn ends at its call: the agent runs it and calls again.
            stop_token_ids=[end] if tools and end is not None else [],
            seed=request.seed,
        )

    async def _generate(self, plan: _Plan, key: KeyPolicy) -> list[Sample]:
        found = self._continued(plan)
        route = self._route(plan, found)
        request = CallRequest(
            prompt=plan.prompt,
            sampling=plan.sampling,
            n=plan.n,
            domain=self.limits.domain,
            tenant=key.tenant,
            tier=key.tier,
            route=route,
            new_samples=plan.n - (1 if found is not None else 0),
        )
        try:
            result = await self.calls.generate(request)
        except CallTimeout:
            raise errors.call_timed_out(self.calls.timeout_s) from None
        samples = samples_of(
            result,
            tokenizer=self.tokenizer,
            tools=plan.tools,
            fallback_version=self._version(),
            opening=plan.opening,
        )
        self._record(plan, samples)
        return samples

    def _route(self, plan: _Plan, found: int | None) -> str:
        """The routing key of the trajectory a call continues or starts (the index it has
        or will have in its session), so that each later turn goes to the server holding
        its prefix; a call outside any session is routed by its own task id."""
        if plan.session is None:
            return ""
        if found is None:
            session = self.sessions.get(plan.owner.key_id, plan.session)
            found = 0 if session is None else len(session.trajectories)
        return f"{plan.session}/{found}"

    def _continued(self, plan: _Plan) -> int | None:
        if plan.session is None:
            return None
        session = self.sessions.get(plan.owner.key_id, plan.session)
        if session is None:
            return None
        return session.continued(plan.prompt, self._version(), self.sessions.max_staleness)

    def _record(self, plan: _Plan, samples: list[Sample]) -> None:
        if plan.session is None:
            return
        call = Call(
            prompt=plan.prompt,
            choices=[
                Completion(ids=s.ids, logprobs=s.logprobs, finish=s.finish, text=s.content)
                for s in samples
            ],
            version=min(s.version for s in samples),
        )
        try:
            self.sessions.record(plan.owner, plan.session, call, self._clock())
        except SessionError as error:
            raise errors.ApiError(429, str(error), code="session_limit") from None

    def _answered(self, owner: Owner, session: str | None) -> list[Answered]:
        if session is None:
            return []
        found = self.sessions.get(owner.key_id, session)
        return [] if found is None else list(found.notes)

    def _remember(
        self, plan: _Plan, chat: list[TemplateMessage], tools: str, samples: list[Sample]
    ) -> None:
        if plan.session is None:
            return
        session = self.sessions.get(plan.owner.key_id, plan.session)
        if session is None:
            return
        before = tuple((m["role"], m["content"]) for m in chat)
        for sample in samples:
            reply = ("assistant", assistant_text(sample.content, sample.calls))
            session.notes.append(
                Answered(
                    before=before,
                    tools=tools,
                    prompt=tuple(plan.prompt),
                    reply=reply,
                    completion=tuple(sample.ids),
                    text=sample.decoded,
                )
            )
        del session.notes[: -self.sessions.max_trajectories]

    def _answer(self, kind: str, prompt_tokens: int, logprobs: bool) -> Answer:
        return Answer(
            id=f"{kind}-{uuid.uuid4().hex}",
            model=self.limits.model_id,
            created=int(time.time()),
            prompt_tokens=prompt_tokens,
            logprobs=logprobs,
            tokenizer=self.tokenizer,
        )


def owner_of(key: KeyPolicy) -> Owner:
    """The owner of the sessions a key names."""
    return Owner(key_id=key.key_id, tenant=key.tenant, timeout_s=key.session_timeout_s)
