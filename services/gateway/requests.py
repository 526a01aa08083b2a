"""Request bodies of ``/v1/chat/completions`` and ``/v1/completions``, parsed into Structs.

One decoder per body type, built once.  A body is refused with an OpenAI-shaped error:
not JSON 400 (``invalid_json``), a parameter this gateway does not support 400
(``unsupported_parameter``, named in ``param``), a required one missing 400, a field of the
wrong type or out of range 422 (named in ``param``).  Inside a message, keys the gateway
does not read are ignored: an SDK sends back the assistant message it received, with
response-only fields such as ``refusal``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta

from services.gateway.errors import ApiError

#: At most this many stop sequences (OpenAI's limit).
MAX_STOP = 4
#: Choices per request at most.
MAX_N = 128

Probability = Annotated[float, Meta(ge=0, le=1)]


class TextPart(msgspec.Struct, kw_only=True):
    type: Literal["text"]
    text: str


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    #: JSON text, as the model wrote it.
    arguments: str


class ToolCallIn(msgspec.Struct, kw_only=True):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class ChatMessageIn(msgspec.Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class FunctionSpec(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    #: A JSON Schema object.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(msgspec.Struct, kw_only=True):
    function: FunctionSpec
    type: Literal["function"] = "function"


class NamedFunction(msgspec.Struct, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    function: NamedFunction
    type: Literal["function"] = "function"


class ChatCompletionRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str
    messages: Annotated[list[ChatMessageIn], Meta(min_length=1)]
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    #: The newer name of ``max_tokens``; at most one of the two is set.
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_N)] = 1
    stop: str | Annotated[list[str], Meta(max_length=MAX_STOP)] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    stream: bool = False
    user: str | None = None


class CompletionRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str
    #: Text, or the caller's own token ids (one prompt per request).
    prompt: str | Annotated[list[Annotated[int, Meta(ge=0)]], Meta(min_length=1)]
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_N)] = 1
    stop: str | Annotated[list[str], Meta(max_length=MAX_STOP)] | None = None
    seed: int | None = None
    #: The legacy API's number of top log-probabilities per token.
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    stream: bool = False
    user: str | None = None


R = TypeVar("R", ChatCompletionRequest, CompletionRequest)
T = TypeVar("T")

_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {
    ChatCompletionRequest: msgspec.json.Decoder(ChatCompletionRequest),
    CompletionRequest: msgspec.json.Decoder(CompletionRequest),
}
#: ``<what> - at `$<path>```, as msgspec writes a validation error.
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>.*)`)?\Z", re.DOTALL)
_FIELD = re.compile(r"field `(?P<field>.*)`", re.DOTALL)


def parse_chat(body: bytes) -> ChatCompletionRequest:
    request = _parse(body, ChatCompletionRequest)
    if request.max_tokens is not None and request.max_completion_tokens is not None:
        raise ApiError(
            400,
            "set one of `max_tokens` and `max_completion_tokens`, not both",
            param="max_completion_tokens",
            code="invalid_value",
        )
    if request.top_logprobs is not None and not request.logprobs:
        raise ApiError(
            400, "`top_logprobs` needs `logprobs: true`", param="top_logprobs", code="invalid_value"
        )
    if request.top_logprobs:
        raise _no_alternatives("top_logprobs")
    if request.tool_choice not in (None, "none") and not request.tools:
        raise ApiError(
            400, "`tool_choice` needs `tools`", param="tool_choice", code="invalid_value"
        )
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice):
        names = [tool.function.name for tool in request.tools or ()]
        if choice.function.name not in names:
            raise ApiError(
                400,
                f"`tool_choice` names {choice.function.name!r}, which is not in `tools` "
                f"({', '.join(names)})",
                param="tool_choice",
                code="invalid_value",
            )
    return request


def parse_completion(body: bytes) -> CompletionRequest:
    request = _parse(body, CompletionRequest)
    if request.logprobs:
        raise _no_alternatives("logprobs")
    return request


def _no_alternatives(param: str) -> ApiError:
    """The engines return the sampled token's log-probability, not the alternatives."""
    return ApiError(
        400,
        f"`{param}` above 0 asks for the most likely alternatives of each token, which the "
        "engines do not return; the sampled tokens' log-probabilities are given with "
        "`logprobs` (chat: true, completions: 0)",
        param=param,
        code="unsupported_value",
    )


def _parse(body: bytes, kind: type[R]) -> R:
    parsed: R = decode_body(body, _DECODERS[kind])
    return parsed


def decode_body(body: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    """A JSON body as ``decoder``'s type, or the OpenAI-shaped refusal that names what is
    wrong with it."""
    try:
        parsed: T = decoder.decode(body)
    except msgspec.ValidationError as error:
        raise invalid(str(error)) from None
    except msgspec.DecodeError as error:
        raise ApiError(400, f"the body is not valid JSON: {error}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the body is nested too deeply", code="invalid_json") from None
    return parsed


def invalid(message: str) -> ApiError:
    """The refusal for one of msgspec's validation messages: which field, and which status."""
    found = _AT.match(message)
    what = found.group("what") if found else message
    path = _param(found.group("path") if found and found.group("path") else "")
    field = _FIELD.search(what)
    if what.startswith("Object contains unknown field") and field:
        name = _joined(path, field.group("field"))
        return ApiError(
            400, f"unsupported parameter: `{name}`", param=name, code="unsupported_parameter"
        )
    if what.startswith("Object missing required field") and field:
        name = _joined(path, field.group("field"))
        return ApiError(
            400,
            f"missing required parameter: `{name}`",
            param=name,
            code="missing_required_parameter",
        )
    if not path:
        return ApiError(400, f"the body must be a JSON object: {what}", code="invalid_request")
    code = "invalid_type" if ", got `" in what else "invalid_value"
    return ApiError(422, f"`{path}`: {what}", param=path, code=code)


def _param(path: str) -> str:
    """``.messages[0].role`` -> ``messages[0].role``."""
    return path.removeprefix(".")


def _joined(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field
