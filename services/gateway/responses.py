"""A call's samples as OpenAI answers: ``chat.completion`` (with ``tool_calls`` parsed
from the model's own format), ``text_completion``, and their streamed chunks.

Every figure comes from what the engine generated: the completion ids and their
behaviour log-probabilities, never a re-tokenization of the text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protocol.messages import CallResult, FinishReason, Rollout, RolloutStatus
from services.gateway import errors
from services.gateway.errors import ApiError
from services.model.chat_template import TemplateTokenizer
from services.model.tool_format import parse_tool_calls


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One choice, as generated and as returned."""

    ids: list[int]
    logprobs: list[float]
    #: The ids decoded whole, end-of-turn token included.
    decoded: str
    finish: FinishReason
    version: int
    content: str
    #: ``(name, arguments JSON)`` of each tool call parsed from the text.
    calls: list[tuple[str, str]]

    @property
    def finish_reason(self) -> str:
        if self.calls:
            return "tool_calls"
        return "length" if self.finish is FinishReason.LENGTH else "stop"


def samples_of(
    result: CallResult,
    *,
    tokenizer: TemplateTokenizer,
    tools: bool,
    fallback_version: int,
    opening: str = "",
) -> list[Sample]:
    """The call's samples in order; a failed one refuses the whole call.  ``opening`` is
    the start of the turn a ``tool_choice`` forced: the answer's text begins with it."""
    for rollout in result.rollouts:
        _check(rollout)
    return [_sample(r, tokenizer, tools, fallback_version, opening) for r in result.rollouts]


def _check(rollout: Rollout) -> None:
    if rollout.status is RolloutStatus.OK:
        return
    if rollout.status is RolloutStatus.INVALID:
        raise ApiError(
            400, f"the request cannot be generated: {rollout.error}", code="invalid_value"
        )
    raise errors.generation_failed(str(rollout.error))


def _sample(
    rollout: Rollout, tokenizer: TemplateTokenizer, tools: bool, version: int, opening: str
) -> Sample:
    ids = [int(i) for i in rollout.completion_ids]
    text = opening + rollout.completion_text
    parsed = parse_tool_calls(text) if tools else None
    content, calls = text, []
    if parsed is not None:
        content = parsed[0]
        calls = [(call.name, json.dumps(call.arguments)) for call in parsed[1]]
    return Sample(
        ids=ids,
        logprobs=[float(x) for x in rollout.behaviour_logprobs],
        decoded=tokenizer.decode(ids),
        finish=rollout.finish_reason,
        version=rollout.policy_version if rollout.policy_version is not None else version,
        content=content,
        calls=calls,
    )


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What every OpenAI answer of one call shares."""

    id: str
    model: str
    created: int
    prompt_tokens: int
    #: The token strings of the log-probabilities, when asked for.
    logprobs: bool
    tokenizer: TemplateTokenizer

    def usage(self, samples: Sequence[Sample]) -> dict[str, int]:
        completion = sum(len(s.ids) for s in samples)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def chat(self, samples: Sequence[Sample]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [self._chat_choice(i, s) for i, s in enumerate(samples)],
            "usage": self.usage(samples),
        }

    def chat_chunks(self, samples: Sequence[Sample]) -> list[dict[str, Any]]:
        """The streamed form: per choice, its role, its whole delta and its end (the
        engine answers a call at once, so each choice is one content chunk)."""
        chunks = []
        for index, sample in enumerate(samples):
            delta = self._message(sample, streamed=True)
            chunks.append(self._chunk([{"index": index, "delta": delta, "finish_reason": None}]))
            end = {"index": index, "delta": {}, "finish_reason": sample.finish_reason}
            if self.logprobs:
                chunks[-1]["choices"][0]["logprobs"] = self._chat_logprobs(sample)
            chunks.append(self._chunk([end]))
        last = self._chunk([])
        last["usage"] = self.usage(samples)
        return [*chunks, last]

    def completion(self, samples: Sequence[Sample]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [self._text_choice(i, s) for i, s in enumerate(samples)],
            "usage": self.usage(samples),
        }

    def completion_chunks(self, samples: Sequence[Sample]) -> list[dict[str, Any]]:
        chunks = [
            {**self.completion([sample]), "choices": [self._text_choice(index, sample)]}
            for index, sample in enumerate(samples)
        ]
        for chunk in chunks:
            chunk.pop("usage")
        return chunks

    def _chat_choice(self, index: int, sample: Sample) -> dict[str, Any]:
        return {
            "index": index,
            "message": self._message(sample, streamed=False),
            "logprobs": self._chat_logprobs(sample) if self.logprobs else None,
            "finish_reason": sample.finish_reason,
        }

    def _message(self, sample: Sample, *, streamed: bool) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": sample.content or None}
        if sample.calls:
            message["tool_calls"] = [
                _tool_call(f"call_{self.id}_{index}", index, name, arguments, streamed)
                for index, (name, arguments) in enumerate(sample.calls)
            ]
        elif not streamed:
            message["content"] = sample.content
        return message

    def _chat_logprobs(self, sample: Sample) -> dict[str, Any]:
        tokens = [self.tokenizer.decode([i]) for i in sample.ids]
        return {
            "content": [
                {
                    "token": token,
                    "logprob": logprob,
                    "bytes": list(token.encode()),
                    "top_logprobs": [],
                }
                for token, logprob in zip(tokens, sample.logprobs, strict=True)
            ]
        }

    def _text_choice(self, index: int, sample: Sample) -> dict[str, Any]:
        logprobs = None
        if self.logprobs:
            logprobs = {
                "tokens": [self.tokenizer.decode([i]) for i in sample.ids],
                "token_logprobs": sample.logprobs,
                "top_logprobs": None,
                "text_offset": [],
            }
        return {
            "index": index,
            "text": sample.content,
            "logprobs": logprobs,
            "finish_reason": sample.finish_reason,
        }

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }


def _tool_call(
    call_id: str, index: int, name: str, arguments: str, streamed: bool
) -> dict[str, Any]:
    call: dict[str, Any] = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return {"index": index, **call} if streamed else call
