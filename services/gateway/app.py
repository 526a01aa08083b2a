"""The gateway's HTTP side (aiohttp.web): routes, authentication, rate limits, errors.

One middleware wraps every route, the unknown ones included: it authenticates the key,
takes a token from its bucket, and turns every refusal into an OpenAI-shaped error and
anything unexpected into a logged 500.  No traceback reaches a client, and no input
stops the server.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import structlog
from aiohttp import web

from protocol.messages import PolicyUpdate
from services.gateway import errors
from services.gateway.errors import ApiError
from services.gateway.generation import Generation, Served, owner_of
from services.gateway.keys import KeyPolicy, KeyRing, bearer, key_id
from services.gateway.problems import Problems
from services.gateway.requests import parse_chat, parse_completion
from services.gateway.rewards import Rewards
from services.gateway.sessions import SESSION_HEADER, BadSessionName, session_name
from services.gateway.settings import GatewaySettings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Where the middleware leaves the caller's key policy for the routes.
_KEY: Final = web.RequestKey("temper_key", KeyPolicy)


@dataclass(kw_only=True)
class _Caller:
    """Who sent a request, as far as it is known: the id logs name the presented key by,
    and the key's policy once the key is known."""

    key_id: str | None = None
    policy: KeyPolicy | None = None


@dataclass(kw_only=True)
class ServedPolicy:
    """The newest policy version announced on the policy-update subject."""

    version: int = 0
    #: Unix time of that announcement; None until one is heard.
    announced_at: float | None = None

    def announced(self, update: PolicyUpdate) -> bool:
        """Take ``update`` if it is newer; whether it was."""
        if update.version < self.version or (
            update.version == self.version and self.announced_at is not None
        ):
            return False
        self.version = update.version
        self.announced_at = update.created_at or time.time()
        return True


class GatewayApp:
    """The routes of the gateway; ``application()`` builds the aiohttp app."""

    def __init__(
        self,
        settings: GatewaySettings,
        keys: KeyRing,
        policy: ServedPolicy,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.policy = policy
        self.log = log
        self.started_at = time.time()
        #: Responses by status.
        self.statuses: Counter[int] = Counter()
        self.in_flight = 0
        #: Set once the service is connected to the bus.
        self.generation: Generation | None = None
        self.rewards: Rewards | None = None
        #: Problems of the domains whose validators score sessions (None: no domains).
        self.problems: Problems | None = None

    def runner(self, shutdown_timeout_s: float) -> web.AppRunner:
        """The server of ``application()``; a stop waits ``shutdown_timeout_s`` at most
        for the requests in flight."""
        return web.AppRunner(
            self.application(),
            access_log=None,  # requests are logged here, keys by their id only
            logger=ServerLog(self.log),
            shutdown_timeout=shutdown_timeout_s,
            # A client that goes away cancels its request: the call it waits for is
            # cancelled on the generators too, and nothing of it is recorded.
            handler_cancellation=True,
        )

    def application(self) -> web.Application:
        # aiohttp refuses a body past client_max_size while reading it, chunk by chunk.
        app = web.Application(
            client_max_size=self.settings.max_body_bytes,
            middlewares=[self._serve],
            # Never a traceback in the web server's own answers, whatever the loop's mode.
            handler_args={"debug": False},
        )
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/temper/sessions/{session}/reward", self.reward)
        app.router.add_post("/v1/temper/sessions/{session}/problem", self.problem)
        return app

    # ------------------------------------------------------------------ middleware

    @web.middleware
    async def _serve(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Authenticate, rate-limit and answer every refusal in the OpenAI shape."""
        caller = _Caller()
        self.in_flight += 1
        try:
            response = await self._authorized(request, handler, caller)
        except ApiError as error:
            response = self._refused(request, error, caller)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            shaped = errors.from_http(error.status, request.method, request.path, error.headers)
            response = self._refused(request, shaped, caller)
        except Exception as error:
            self.log.exception(
                "request_failed",
                method=request.method,
                path=request.path[:200],
                key=caller.key_id,
                error=repr(error),
            )
            response = _json(errors.internal_error().body(), 500)
        finally:
            self.in_flight -= 1
        self.statuses[response.status] += 1
        return response

    async def _authorized(
        self, request: web.Request, handler: Handler, caller: _Caller
    ) -> web.StreamResponse:
        key = bearer(request.headers.get("Authorization"))
        caller.key_id = key_id(key)
        caller.policy = self.keys.lookup(key)
        self.keys.admit(caller.policy)
        request[_KEY] = caller.policy
        return await handler(request)

    def _refused(self, request: web.Request, error: ApiError, caller: _Caller) -> web.Response:
        self.log.info(
            "request_refused",
            status=error.status,
            code=error.code,
            param=error.param,
            method=request.method,
            path=request.path[:200],
            key=caller.key_id,
        )
        return _json(error.body(), error.status, error.headers)

    # ------------------------------------------------------------------ routes

    async def models(self, request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        self._check_model(request.match_info["model"])
        return _json(self._model_card())

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        parsed = parse_chat(await self._body(request))
        self._check_model(parsed.model)
        session = self._session(request, parsed.user)
        served = await self._generation().chat(parsed, request[_KEY], session)
        return await _send(request, served)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        parsed = parse_completion(await self._body(request))
        self._check_model(parsed.model)
        session = self._session(request, parsed.user)
        served = await self._generation().completion(parsed, request[_KEY], session)
        return await _send(request, served)

    async def reward(self, request: web.Request) -> web.Response:
        policy: KeyPolicy = request[_KEY]
        name = self._session(request, request.match_info["session"])
        assert name is not None
        if self.rewards is None:
            raise errors.generation_failed("the gateway is not connected to the bus yet")
        body = await self._body(request)
        return _json(await self.rewards.close(policy.key_id, name, body))

    async def problem(self, request: web.Request) -> web.Response:
        policy: KeyPolicy = request[_KEY]
        name = self._session(request, request.match_info["session"])
        assert name is not None
        if self.problems is None:
            raise ApiError(
                404,
                "this gateway hands out no problems (it has no domains)",
                code="no_domains",
            )
        body = await self._body(request)
        return _json(self.problems.bind(owner_of(policy), name, body))

    # ------------------------------------------------------------------ helpers

    def _generation(self) -> Generation:
        if self.generation is None:
            raise errors.generation_failed("the gateway is not connected to the bus yet")
        return self.generation

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.settings.model_id,
            "object": "model",
            "created": int(self.policy.announced_at or self.started_at),
            "owned_by": "temper",
            "policy_version": self.policy.version,
        }

    def _check_model(self, model: str) -> None:
        if model != self.settings.model_id:
            raise errors.unknown_model(model, self.settings.model_id)

    async def _body(self, request: web.Request) -> bytes:
        limit = self.settings.max_body_bytes
        size = request.content_length
        if size is not None and size > limit:
            raise errors.too_large(limit, size)  # refused before a byte of it is read
        return await request.read()

    def _session(self, request: web.Request, user: str | None) -> str | None:
        """The session the call belongs to (None: it is not recorded)."""
        try:
            return session_name(request.headers.get(SESSION_HEADER), user)
        except BadSessionName as error:
            raise ApiError(400, str(error), param=error.source, code="invalid_session") from None


class ServerLog:
    """Where the web server logs what it could not hand to the app (a request that is not
    HTTP, a header line past its limit).  Its messages quote the request, which may hold
    a key: only the kind of error is written."""

    def __init__(self, log: structlog.typing.FilteringBoundLogger) -> None:
        self._log = log

    def debug(self, *args: Any, **kwargs: Any) -> None:
        """Premature disconnections and the like: not worth a line."""

    def exception(self, message: str, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        """The static message only (its arguments and the error's text are left out)."""
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        self._log.warning(
            "web_server_error",
            what=message,
            error=type(error).__name__ if error is not None else None,
            status=getattr(error, "code", None),
        )

    warning = error = exception


async def _send(request: web.Request, served: Served) -> web.StreamResponse:
    """One JSON body, or the chunks as server-sent events ending with ``[DONE]``."""
    if served.chunks is None:
        return _json(served.body)
    response = web.StreamResponse(headers={"Cache-Control": "no-cache"})
    response.content_type = "text/event-stream"
    await response.prepare(request)
    for chunk in served.chunks:
        await response.write(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(body),
        status=status,
        headers=headers,
        content_type="application/json",
    )
