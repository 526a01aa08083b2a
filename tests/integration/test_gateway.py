"""The gateway service on a real nats-server, over real HTTP (aiohttp's client).

Keys, rate limits, the OpenAI error shapes of every refusal, ``/v1/models`` following
the policy-update subject, a 504 when no generator answers a call in time, and a server
that no malformed input stops.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from protocol import subjects
from protocol.codec import encode
from protocol.messages import PolicyUpdate
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings
from tests.integration.support import client, runtime

#: Log lines are read here: structlog as out of the box, whatever the worker set up.
pytestmark = pytest.mark.usefixtures("structlog_defaults")

KEY = "sk-open-0123456789abcdef"
#: Two requests at once, then one every 2.5 s.
SLOW_KEY = "sk-slow-0123456789abcdef"
MODEL = "temper-policy"
LIMIT = 64 * 1024
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
WAIT_S = 10.0


def settings(url: str, model: Path) -> GatewaySettings:
    keys = [
        {"key": KEY, "tenant": "acme", "rate_per_s": 0},
        {"key": SLOW_KEY, "tenant": "slow", "rate_per_s": 0.4, "burst": 2},
    ]
    return GatewaySettings(
        runtime=runtime(url, instance="gw"),
        port=0,
        model_id=MODEL,
        model=model,
        keys=json.dumps({"keys": keys}),
        max_body_bytes=LIMIT,
        # No generator runs here: a call waits this long, then is a 504.
        call_timeout_s=1.5,
    )


@pytest.fixture
async def gateway(nats_url: str, tiny_model: Path) -> AsyncIterator[GatewayService]:
    async with (
        asyncio.timeout(WAIT_S * 3),
        GatewayService(settings(nats_url, tiny_model)) as service,
    ):
        assert isinstance(service, GatewayService)
        yield service


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session:
        yield session


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def call(
    http: aiohttp.ClientSession,
    gateway: GatewayService,
    method: str,
    path: str,
    *,
    key: str | None = KEY,
    **kwargs: Any,
) -> tuple[int, dict[str, Any], aiohttp.ClientResponse]:
    headers = {**(auth(key) if key else {}), **kwargs.pop("headers", {})}
    async with http.request(method, gateway.url + path, headers=headers, **kwargs) as response:
        assert response.content_type == "application/json"
        return response.status, await response.json(), response


def shaped(body: dict[str, Any]) -> dict[str, Any]:
    """The error object, checked to have exactly OpenAI's four fields."""
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert "Traceback" not in body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


async def test_a_missing_or_bad_key_is_401(
    gateway: GatewayService, http: aiohttp.ClientSession
) -> None:
    for key, code in [(None, "missing_api_key"), ("sk-nope-0123456789abcdef", "invalid_api_key")]:
        status, body, response = await call(http, gateway, "GET", "/v1/models", key=key)
        assert status == 401 and shaped(body)["code"] == code
        assert response.headers["WWW-Authenticate"] == "Bearer"


async def test_over_the_rate_limit_is_429_with_retry_after(
    gateway: GatewayService, http: aiohttp.ClientSession
) -> None:
    answers = [await call(http, gateway, "GET", "/v1/models", key=SLOW_KEY) for _ in range(3)]
    assert [status for status, _, _ in answers] == [200, 200, 429]
    _, body, response = answers[2]
    assert shaped(body)["code"] == "rate_limit_exceeded"
    assert response.headers["Retry-After"] == "3"  # 2.5 s to the next token, rounded up
    # Another key is not held back by it.
    assert (await call(http, gateway, "GET", "/v1/models"))[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code", "param"),
    [
        ("POST", "/v1/chat/completions", b"{not json", 400, "invalid_json", None),
        (
            "POST",
            "/v1/chat/completions",
            {**CHAT, "frequency_penalty": 1},
            400,
            "unsupported_parameter",
            "frequency_penalty",
        ),
        (
            "POST",
            "/v1/chat/completions",
            {"model": MODEL},
            400,
            "missing_required_parameter",
            "messages",
        ),
        (
            "POST",
            "/v1/chat/completions",
            {**CHAT, "temperature": "warm"},
            422,
            "invalid_type",
            "temperature",
        ),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": 5}, 422, "invalid_type", "prompt"),
        (
            "POST",
            "/v1/chat/completions",
            {**CHAT, "model": "gpt-4o"},
            404,
            "model_not_found",
            "model",
        ),
        ("GET", "/v1/models/gpt-4o", None, 404, "model_not_found", "model"),
        ("GET", "/v1/engines", None, 404, "unknown_url", None),
        ("DELETE", "/v1/models", None, 405, "method_not_allowed", None),
        ("GET", "/v1/chat/completions", None, 405, "method_not_allowed", None),
    ],
)
async def test_each_refusal_has_its_status_and_the_openai_shape(
    gateway: GatewayService,
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    body: Any,
    status: int,
    code: str,
    param: str | None,
) -> None:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    got, answer, response = await call(http, gateway, method, path, data=data)
    error = shaped(answer)
    assert (got, error["code"], error["param"]) == (status, code, param)
    if status == 405:
        assert "Allow" in response.headers


async def test_a_body_over_the_limit_is_413_before_it_is_read_whole(
    gateway: GatewayService, http: aiohttp.ClientSession
) -> None:
    big = json.dumps({**CHAT, "user": "x" * (LIMIT + 10)}).encode()
    status, body, _ = await call(http, gateway, "POST", "/v1/chat/completions", data=big)
    assert status == 413 and shaped(body)["code"] == "request_too_large"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: refused while read
        for _ in range(LIMIT // 1024 + 8):
            yield b" " * 1024

    status, body, _ = await call(http, gateway, "POST", "/v1/chat/completions", data=chunks())
    assert status == 413 and shaped(body)["code"] == "request_too_large"
    assert (await call(http, gateway, "GET", "/v1/models"))[0] == 200


async def test_token_ids_outside_the_vocabulary_are_refused_before_any_generation(
    gateway: GatewayService, http: aiohttp.ClientSession
) -> None:
    request = {"model": MODEL, "prompt": [1, 2, 10**6]}
    status, body, _ = await call(http, gateway, "POST", "/v1/completions", json=request)
    error = shaped(body)
    assert (status, error["param"], error["code"]) == (422, "prompt", "invalid_value")
    assert "outside the model's vocabulary" in error["message"]
    assert gateway.statistics().get("calls_sent", 0) == 0


async def test_a_valid_call_with_no_generator_to_answer_is_a_504(
    gateway: GatewayService, http: aiohttp.ClientSession
) -> None:
    for path, request in [
        ("/v1/chat/completions", {**CHAT, "stream": True, "user": "alice"}),
        ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 3]}),
    ]:
        status, body, _ = await call(http, gateway, "POST", path, json=request)
        error = shaped(body)
        assert (status, error["code"], error["type"]) == (504, "generation_timeout", "server_error")
        assert "no generator answered within 1.5 s" in error["message"]
    assert gateway.statistics()["calls_timed_out"] == 2
    headers = {"X-Temper-Session": " "}
    status, body, _ = await call(
        http, gateway, "POST", "/v1/chat/completions", json=CHAT, headers=headers
    )
    assert (status, shaped(body)["param"]) == (400, "X-Temper-Session")


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        (b"{", 400, "invalid_json", None),
        # Empty: what closes a session its validators score (tests/adversarial/test_gateway.py).
        (b"{}", 404, "no_session", "session"),
        (b'{"reward": 1, "rewards": [1]}', 400, "invalid_value", "reward"),
        (b'{"reward": 1.5}', 422, "invalid_value", "reward"),
        (b'{"rewards": []}', 422, "invalid_value", "rewards"),
        (b'{"reward": "high"}', 422, "invalid_type", "reward"),
        (b'{"reward": 1, "bonus": 2}', 400, "unsupported_parameter", "bonus"),
        # Well formed, but no such session is open under this key.
        (b'{"reward": 1}', 404, "no_session", "session"),
    ],
)
async def test_a_bad_reward_is_refused_with_its_reason(
    gateway: GatewayService,
    http: aiohttp.ClientSession,
    body: bytes,
    status: int,
    code: str,
    param: str | None,
) -> None:
    path = "/v1/temper/sessions/nobody/reward"
    got, answer, _ = await call(http, gateway, "POST", path, data=body)
    error = shaped(answer)
    assert (got, error["code"], error["param"]) == (status, code, param)
    assert gateway.statistics().get("rollouts_published", 0) == 0


async def test_models_lists_the_served_policy_and_follows_its_updates(
    nats_url: str, tiny_model: Path, gateway: GatewayService, http: aiohttp.ClientSession
) -> None:
    status, body, _ = await call(http, gateway, "GET", "/v1/models")
    assert status == 200 and body["object"] == "list"
    assert [(m["id"], m["object"], m["policy_version"]) for m in body["data"]] == [
        (MODEL, "model", 0)
    ]
    update = PolicyUpdate(
        version=7, uri="/weights/v7", digest="sha256:" + "0" * 64, created_at=1.7e9
    )
    async with client(nats_url) as nc:
        await nc.jetstream().publish(subjects.policy_update(), encode(update))
    async with asyncio.timeout(WAIT_S):
        while gateway.policy.version != 7:
            await asyncio.sleep(0.02)
    status, card, _ = await call(http, gateway, "GET", f"/v1/models/{MODEL}")
    assert (status, card["id"], card["policy_version"], card["created"]) == (
        200,
        MODEL,
        7,
        1_700_000_000,
    )
    # A gateway started later catches up from the policy stream.
    async with GatewayService(settings(nats_url, tiny_model)) as late:
        assert isinstance(late, GatewayService)
        status, body, _ = await call(http, late, "GET", "/v1/models")
        assert body["data"][0]["policy_version"] == 7
    assert gateway.statistics()["policy_version"] == 7.0


async def test_malformed_input_never_stops_it(
    gateway: GatewayService,
    http: aiohttp.ClientSession,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert gateway.port is not None
    # Requests the web server cannot parse: its own messages would quote them, key included.
    keyed = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
    junk = [
        b"\x00\x01\x02 garbage\r\n\r\n",
        keyed + b"k" * 100_000 + b"\r\n\r\n",  # a header line past its limit
        keyed + b"\x01\r\n\r\n",  # a control character in a header
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n{",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ]
    for payload in junk:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(payload)
        await writer.drain()
        writer.close()
        await asyncio.gather(reader.read(), return_exceptions=True)
    deep = b'{"a": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    nested = {**CHAT, "tools": [{"function": {"name": "f", "parameters": "PARAMS"}}]}
    bad_bodies = [
        b"\xff" * 100,
        b"[" * 50_000,
        json.dumps(nested).encode().replace(b'"PARAMS"', deep),  # past the recursion limit
        b'{"model": "' + b"\\u0000" * 1000 + b'"}',
        b"null",
    ]
    for data in bad_bodies:
        status, body, _ = await call(http, gateway, "POST", "/v1/chat/completions", data=data)
        assert 400 <= status < 500 and shaped(body)
    status, _, _ = await call(http, gateway, "GET", "/v1/models")
    assert status == 200
    assert not gateway.crashed.is_set() and gateway.health()[0]
    assert gateway.http.statuses[500] == 0  # every one of them was a refusal, not a failure
    assert gateway.http.in_flight == 0
    logged = capsys.readouterr()
    assert KEY not in logged.out + logged.err + caplog.text
    assert "web_server_error" in logged.out


async def test_a_stop_closes_the_port(
    nats_url: str, tiny_model: Path, http: aiohttp.ClientSession
) -> None:
    service = GatewayService(settings(nats_url, tiny_model))
    async with asyncio.timeout(WAIT_S * 2):
        await service.start()
        url = service.url
        assert (await call(http, service, "GET", "/v1/models"))[0] == 200
        await service.stop()
    assert service.url == "" and not service.health()[0]
    with pytest.raises(aiohttp.ClientConnectionError):
        async with http.get(url + "/v1/models", headers=auth()):
            pass
