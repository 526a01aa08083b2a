"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal of the gateway is an :class:`ApiError`; the HTTP layer turns it into a
JSON response with its status and headers.  The messages name the problem and never
echo a key or a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: OpenAI's error types: what a client's SDK maps to its exception classes.
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
RATE_LIMIT = "rate_limit_error"
NOT_FOUND = "not_found_error"
SERVER = "server_error"
#: A field name shown back is cut to this length (an unknown field may be any size) ...
MAX_PARAM = 200
#: ... and a message to this one (a refused value may be quoted in it).
MAX_MESSAGE = 1000


class ApiError(Exception):
    """A refusal: its HTTP status and the OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        message = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param[:MAX_PARAM] if param is not None else None
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.code!r}, param={self.param!r})"


def missing_key() -> ApiError:
    return ApiError(
        401,
        "no API key: send the header 'Authorization: Bearer <key>'",
        type=AUTHENTICATION,
        code="missing_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def invalid_key() -> ApiError:
    return ApiError(
        401,
        "the API key is not valid",
        type=AUTHENTICATION,
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def rate_limited(wait_s: float) -> ApiError:
    """429 with ``Retry-After`` in whole seconds, rounded up (at least 1)."""
    seconds = max(1, math.ceil(wait_s))
    return ApiError(
        429,
        f"rate limit of this API key reached: retry after {seconds}s",
        type=RATE_LIMIT,
        code="rate_limit_exceeded",
        headers={"Retry-After": str(seconds)},
    )


def too_large(limit: int, size: int | None = None) -> ApiError:
    what = f"the request body of {size} bytes" if size is not None else "the request body"
    return ApiError(413, f"{what} exceeds the limit of {limit} bytes", code="request_too_large")


def unknown_model(model: str, served: str) -> ApiError:
    return ApiError(
        404,
        f"the model {model[:MAX_PARAM]!r} does not exist: this gateway serves {served!r}",
        type=NOT_FOUND,
        param="model",
        code="model_not_found",
    )


def generation_failed(reason: str) -> ApiError:
    return ApiError(503, f"generation failed: {reason}", type=SERVER, code="generation_failed")


def call_timed_out(timeout_s: float) -> ApiError:
    return ApiError(
        504,
        f"no generator answered within {timeout_s:g} s (are generators running and "
        "following this policy?)",
        type=SERVER,
        code="generation_timeout",
    )


def context_exceeded(prompt: int, room: int, context: int) -> ApiError:
    return ApiError(
        400,
        f"the prompt is {prompt} tokens and asks for {room} more; the model's context is "
        f"{context} tokens",
        param="messages",
        code="context_length_exceeded",
    )


def internal_error() -> ApiError:
    return ApiError(
        500, "the gateway failed on this request; it was logged", type=SERVER, code="internal_error"
    )


#: What the HTTP layer's own refusals (routing, body size) become.
_HTTP: Mapping[int, tuple[str, str, str]] = {
    400: (INVALID_REQUEST, "bad_request", "the request could not be read"),
    404: (NOT_FOUND, "unknown_url", "no such route"),
    405: (INVALID_REQUEST, "method_not_allowed", "this method is not allowed here"),
    413: (INVALID_REQUEST, "request_too_large", "the request body is too large"),
}


def from_http(status: int, method: str, path: str, headers: Mapping[str, str]) -> ApiError:
    """The OpenAI-shaped form of an HTTP error the web server raised itself (404 for an
    unknown route, 405 with its ``Allow``, 413 past the body limit)."""
    type_, code, what = _HTTP.get(status, (INVALID_REQUEST if status < 500 else SERVER, "", ""))
    message = f"{what}: {method} {path[:MAX_PARAM]}" if what else f"HTTP {status}"
    kept = {name: value for name, value in headers.items() if name.lower() == "allow"}
    if kept:
        message += f" (allowed: {', '.join(kept.values())})"
    return ApiError(status, message, type=type_, code=code or None, headers=kept)
