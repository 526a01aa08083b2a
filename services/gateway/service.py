"""Gateway service: OpenAI-compatible HTTP on the bus (docs/gateway.md).

The HTTP server (aiohttp.web) runs inside the service's lifecycle: it listens once the
service has connected and caught up on the policy version, and a stop closes it first
(no new request is taken), lets requests in flight finish within the grace period, then
closes the bus.  The served version comes from the policy-update subject the generators
follow, caught up from the policy stream at start and after a reconnect.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from protocol import subjects
from protocol.codec import Codec
from protocol.messages import CallResult, PolicyUpdate
from services.domains.registry import DomainRegistry, load_registry
from services.gateway.app import GatewayApp, ServedPolicy
from services.gateway.calls import Calls
from services.gateway.generation import Generation, Limits
from services.gateway.journal import SessionJournal
from services.gateway.keys import KeyRing
from services.gateway.problems import Problems
from services.gateway.rewards import Rewards
from services.gateway.sessions import SessionStore
from services.gateway.settings import GatewaySettings
from services.model.chat_template import TemplateTokenizer
from services.runtime.policy import last_policy_update
from services.runtime.responder import Request
from services.runtime.service import Service


class GatewayListenError(OSError):
    """The HTTP port could not be opened (taken, or not allowed)."""


class GatewayModelError(ValueError):
    """No model directory to tokenize with."""


class GatewayService(Service):
    name = "gateway"

    def __init__(
        self, settings: GatewaySettings, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(settings.runtime)
        self.settings = settings
        self._clock = clock
        # Bad keys stop the service before it connects, naming the entry.
        self.keys = KeyRing.load(settings, clock)
        self.policy = ServedPolicy()
        self.journal = SessionJournal(
            None if settings.state_dir is None else settings.state_dir / "sessions.journal"
        )
        #: Sessions a previous run of this gateway left open: lost, never trained on.  Read
        #: before anything reports, so the first figures already count them.
        self.sessions_lost = self.journal.recover()
        self.sessions = SessionStore(
            max_sessions=settings.max_sessions,
            max_trajectories=settings.max_trajectories,
            max_staleness=settings.max_staleness,
            on_open=self.journal.opened,
            on_end=self.journal.ended,
        )
        self.http = GatewayApp(settings, self.keys, self.policy, self.log)
        # A model that cannot be read stops the service before it connects.
        self.tokenizer = _tokenizer(settings.model)
        self.context, self.vocab = _model_sizes(settings.model)
        self.calls: Calls | None = None
        #: The domains whose validators score sessions bound to their problems.
        self.registry = DomainRegistry([])
        self._http_runner: web.AppRunner | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        """Where the gateway answers (``…/v1`` is an OpenAI ``base_url``); empty when closed."""
        if self.port is None:
            return ""
        host = self.settings.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    async def setup(self) -> None:
        if self.sessions_lost:
            self.log.warning("sessions_lost", sessions=self.sessions_lost, reason="restart")
        self.registry = await asyncio.to_thread(load_registry, self.settings.domains_config)
        await self._catch_up_policy()
        self.listen(subjects.policy_update(), Codec(PolicyUpdate), self._on_policy)
        self._connect_generation()
        await self._open_http()

    def _connect_generation(self) -> None:
        settings = self.settings
        calls = Calls(self.bus, self.instance, settings.call_timeout_s)
        self.listen(calls.subject, Codec(CallResult), self._on_answer)
        limits = Limits(
            model_id=settings.model_id,
            domain=settings.domain,
            context=self.context,
            max_tokens=settings.max_tokens,
            vocab=self.vocab,
        )
        self.http.generation = Generation(
            tokenizer=self.tokenizer,
            calls=calls,
            sessions=self.sessions,
            limits=limits,
            version=lambda: self.policy.version,
            clock=self._clock,
        )
        self.http.rewards = Rewards(self.bus, self.sessions, settings.domain)
        self.http.problems = Problems(self.registry, self.sessions, self._clock)
        self.calls = calls

    async def _on_answer(self, result: CallResult, _: Request) -> None:
        assert self.calls is not None
        await self.calls.answered(result)

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [self._reap()]

    async def reconnected(self) -> None:
        await self._catch_up_policy()  # an update announced while away

    async def intake_stopped(self) -> None:
        await self._close_http()

    async def teardown(self) -> None:
        await self._close_http()
        self.journal.close()

    # ------------------------------------------------------------------ HTTP

    async def _open_http(self) -> None:
        runner = self.http.runner(shutdown_timeout_s=self.runtime.grace_s)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.host, self.settings.port)
        try:
            await site.start()
        except OSError as error:
            await runner.cleanup()
            where = f"{self.settings.host}:{self.settings.port}"
            raise GatewayListenError(
                error.errno, f"the gateway cannot listen on {where}: {error.strerror}"
            ) from error
        self._http_runner = runner
        self.port = int(runner.addresses[0][1])
        self.log.info("gateway_listening", url=self.url, model=self.settings.model_id)

    async def _close_http(self) -> None:
        """Stop taking requests, let those in flight finish (within the grace), close."""
        runner, self._http_runner = self._http_runner, None
        if runner is None:
            return
        await runner.cleanup()
        self.port = None
        self.log.info("gateway_closed", served=sum(self.http.statuses.values()))

    # ------------------------------------------------------------------ policy, sessions

    async def _catch_up_policy(self) -> None:
        update = await last_policy_update(self.bus.js, self.log)
        if update is not None:
            self._heard(update)

    async def _on_policy(self, update: PolicyUpdate, _: Request) -> None:
        self._heard(update)

    def _heard(self, update: PolicyUpdate) -> None:
        if self.policy.announced(update):
            self.log.info("policy_version", version=update.version)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_s)
            dropped = self.sessions.expire(self._clock())
            if dropped:
                self.log.info("sessions_expired", sessions=dropped)

    # ------------------------------------------------------------------ reporting

    @property
    def in_flight(self) -> int:
        return super().in_flight + self.http.in_flight

    def health(self) -> tuple[bool, str]:
        ok, detail = super().health()
        if ok and self._http_runner is None:
            return False, "not listening"
        return (
            ok,
            detail or f"{self.url} model={self.settings.model_id} version={self.policy.version}",
        )

    def statistics(self) -> dict[str, float]:
        values = super().statistics()
        values["policy_version"] = float(self.policy.version)
        values["keys"] = float(len(self.keys))
        for status, count in self.http.statuses.items():
            values[f"http_{status}"] = float(count)
        values.update(self.sessions.statistics())
        values["sessions_lost"] = float(self.sessions_lost)
        if self.calls is not None:
            values.update(self.calls.statistics())
        generation = self.http.generation
        if generation is not None:
            values["prompts_extended"] = float(generation.prompter.extended)
            values["prompts_rendered"] = float(generation.prompter.rendered)
        if self.http.rewards is not None:
            values["rollouts_published"] = float(self.http.rewards.published)
        return values


def _tokenizer(model: Path | None) -> TemplateTokenizer:
    if model is None:
        raise GatewayModelError(
            "the gateway needs the policy's model directory (TEMPER_GATEWAY_MODEL), the one "
            "the generators serve: its tokenizer makes the prompts"
        )
    if not (model / "config.json").is_file():
        raise GatewayModelError(f"TEMPER_GATEWAY_MODEL {model}: not a model directory")
    return TemplateTokenizer.load(model)


def _model_sizes(model: Path | None) -> tuple[int, int]:
    """The model's context length and vocabulary size, from its ``config.json``."""
    assert model is not None
    config: dict[str, Any] = json.loads((model / "config.json").read_text())
    return int(config.get("max_position_embeddings", 4096)), int(config["vocab_size"])
