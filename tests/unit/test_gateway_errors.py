"""The gateway's request parsing and its OpenAI-shaped errors (no server: the middlewares
is called with aiohttp's mocked requests)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from structlog.testing import capture_logs

from services.gateway import errors
from services.gateway.app import GatewayApp, ServedPolicy
from services.gateway.errors import ApiError
from services.gateway.keys import KeyRing
from services.gateway.requests import parse_chat, parse_completion
from services.gateway.settings import GatewaySettings

#: Log lines are read here: structlog as out of the box, whatever the worker set up.
pytestmark = pytest.mark.usefixtures("structlog_defaults")

KEY = "sk-test-0123456789abcdef"
CHAT: dict[str, Any] = {"model": "temper-policy", "messages": [{"role": "user", "content": "hi"}]}


def chat(**fields: Any) -> bytes:
    return json.dumps({**CHAT, **fields}).encode()


def refused(body: bytes, parse: Callable[[bytes], object] = parse_chat) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(body)
    return caught.value


def test_a_full_chat_request_is_parsed() -> None:
    request = parse_chat(
        chat(
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "2+2?"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,  # sent back by SDKs: ignored
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "add", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "4"},
            ],
            tools=[
                {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
            ],
            tool_choice={"type": "function", "function": {"name": "add"}},
            temperature=0.7,
            top_p=0.9,
            max_tokens=64,
            n=2,
            stop=["\n\n"],
            seed=3,
            logprobs=True,
            top_logprobs=0,
            stream=True,
            user="alice",
        )
    )
    assert request.messages[2].tool_calls is not None
    assert request.messages[2].tool_calls[0].function.name == "add"
    assert (request.temperature, request.n, request.top_logprobs, request.user) == (
        0.7,
        2,
        0,
        "alice",
    )
    assert request.stream and request.tool_choice is not None


def test_a_completion_takes_text_or_token_ids() -> None:
    assert parse_completion(b'{"model": "m", "prompt": "hi"}').prompt == "hi"
    assert parse_completion(b'{"model": "m", "prompt": [1, 2, 3], "logprobs": 0}').prompt == [
        1,
        2,
        3,
    ]
    # The alternatives of each token are more than the engines return.
    error = refused(b'{"model": "m", "prompt": [1], "logprobs": 1}', parse_completion)
    assert (error.status, error.param, error.code) == (400, "logprobs", "unsupported_value")
    error = refused(b'{"model": "m", "prompt": ["a", "b"]}', parse_completion)
    assert (error.status, error.param) == (422, "prompt[0]")


@pytest.mark.parametrize(
    "body",
    [b"{", b"not json", b'{"model": "m", "messages": [{"role": "user"}]} x', b"\xff\xfe", b""],
)
def test_malformed_json_is_400(body: bytes) -> None:
    error = refused(body)
    assert (error.status, error.code, error.type) == (400, "invalid_json", "invalid_request_error")


def test_a_body_that_is_not_an_object_or_nested_too_deeply_is_400() -> None:
    assert refused(b"[1, 2]").status == 400
    deep = b'{"model": "m", "messages": [{"role": "user"}], '
    deep += b'"tools": [{"function": {"name": "f", "parameters": {"a": '
    deep += b"[" * 100_000 + b"]" * 100_000 + b"}}}]}"
    error = refused(deep)
    assert (error.status, error.code) == (400, "invalid_json")


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"temperature": "hot"}, "temperature", "invalid_type"),
        ({"n": True}, "n", "invalid_type"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "invalid_type"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "invalid_value"),
        ({"temperature": 2.5}, "temperature", "invalid_value"),
        ({"top_p": 0}, "top_p", "invalid_value"),
        ({"n": 0}, "n", "invalid_value"),
        ({"messages": []}, "messages", "invalid_value"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
        ({"tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
    ],
)
def test_a_field_of_the_wrong_type_or_range_is_422_and_named(
    fields: dict[str, Any], param: str, code: str
) -> None:
    error = refused(chat(**fields))
    assert (error.status, error.param, error.code) == (422, param, code)
    assert param in error.message


@pytest.mark.parametrize("name", ["frequency_penalty", "logit_bias", "response_format"])
def test_an_unsupported_parameter_is_400_and_named(name: str) -> None:
    error = refused(chat(**{name: 0}))
    assert (error.status, error.param, error.code) == (400, name, "unsupported_parameter")
    assert name in error.message


def test_a_missing_parameter_is_400_and_named() -> None:
    error = refused(b'{"model": "m"}')
    assert (error.status, error.param, error.code) == (
        400,
        "messages",
        "missing_required_parameter",
    )
    nested = refused(chat(messages=[{"content": "hi"}]))
    assert (nested.status, nested.param) == (400, "messages[0].role")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
        ({"max_tokens": 5, "max_completion_tokens": 5}, "max_completion_tokens"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_parameters_that_need_each_other_are_400(fields: dict[str, Any], param: str) -> None:
    error = refused(chat(**fields))
    assert (error.status, error.param) == (400, param)


def test_a_huge_unknown_field_is_cut_in_the_error() -> None:
    name = "x" * 100_000
    error = refused(chat(**{name: 1}))
    assert error.param is not None and len(error.param) == errors.MAX_PARAM
    assert len(error.message) <= errors.MAX_MESSAGE


def test_the_error_object_has_the_openai_shape() -> None:
    body = errors.unknown_model("gpt-4o", "temper-policy").body()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == "model" and body["error"]["code"] == "model_not_found"


def test_an_http_refusal_keeps_its_allow_header() -> None:
    error = errors.from_http(405, "DELETE", "/v1/models", {"Allow": "GET,HEAD", "X-Other": "1"})
    assert (error.status, error.code, error.headers) == (
        405,
        "method_not_allowed",
        {"Allow": "GET,HEAD"},
    )
    assert "DELETE /v1/models" in error.message and "GET,HEAD" in error.message
    assert errors.from_http(404, "GET", "/nope", {}).type == "not_found_error"


# ---------------------------------------------------------------- middleware


def gateway() -> GatewayApp:
    keys = KeyRing.load(GatewaySettings(keys=json.dumps({"keys": [{"key": KEY, "tenant": "t"}]})))
    return GatewayApp(GatewaySettings(), keys, ServedPolicy(), structlog.get_logger())


async def through(
    app: GatewayApp, handler: Callable[[web.Request], Awaitable[web.StreamResponse]], **headers: str
) -> tuple[int, dict[str, Any], web.StreamResponse]:
    """What the middleware answers around ``handler``."""
    request = make_mocked_request("POST", "/v1/chat/completions", headers=headers)
    response = await app._serve(request, handler)
    assert isinstance(response, web.Response)
    body = msgspec.json.decode(response.body) if response.body else {}  # type: ignore[arg-type]
    return response.status, body, response


async def test_an_unexpected_failure_is_a_logged_500_without_traceback() -> None:
    async def broken(_: web.Request) -> web.StreamResponse:
        raise RuntimeError("secret internals at line 42")

    app = gateway()
    with capture_logs() as logs:
        status, body, _ = await through(app, broken, Authorization=f"Bearer {KEY}")
    assert status == 500 and body["error"]["code"] == "internal_error"
    text = json.dumps(body)
    assert "secret internals" not in text and "Traceback" not in text
    failed = [entry for entry in logs if entry["event"] == "request_failed"]
    assert failed and "secret internals" in failed[0]["error"] and failed[0]["exc_info"]
    assert KEY not in repr(logs)
    assert app.in_flight == 0 and app.statuses[500] == 1


async def test_a_web_server_refusal_is_shaped() -> None:
    async def wrong_method(_: web.Request) -> web.StreamResponse:
        raise web.HTTPMethodNotAllowed("POST", ["GET"])

    status, body, response = await through(gateway(), wrong_method, Authorization=f"Bearer {KEY}")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"
    assert response.headers["Allow"] == "GET"


async def test_the_middleware_refuses_a_bad_key_before_the_handler() -> None:
    reached: list[web.Request] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        reached.append(request)
        return web.Response()

    app = gateway()
    with capture_logs() as logs:
        status, body, response = await through(
            app, handler, Authorization="Bearer sk-wrong-0123456789ab"
        )
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert not reached
    assert "sk-wrong" not in repr(logs) and logs[0]["key"]
    status, _, _ = await through(app, handler, Authorization=f"Bearer {KEY}")
    assert status == 200 and len(reached) == 1
