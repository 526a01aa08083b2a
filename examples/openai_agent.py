"""An agent written only against the official ``openai`` client, trained through Temper.

It answers questions that are out of reach without its ``python`` tool (modular powers
with large exponents): it calls the tool as often as it likes, reads each output, and
gives its final answer as ``<answer>...</answer>``.  The tool runs here, in a
subprocess of this agent, as an agent's own tools do.

Pointed at Temper's gateway, every call it makes is recorded as training data.  Each
problem is one session: the first call asks for several attempts at once (``n``), each
attempt goes on as its own conversation, and the rewards (1 for a right answer, else 0)
close the session, which the learner then trains on (docs/gateway.md).

    python examples/openai_agent.py --base-url http://127.0.0.1:8400/v1 --api-key KEY

Against any other OpenAI-compatible server it runs the same; only the reward post is
Temper's own (``--no-reward`` leaves it out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncOpenAI, BadRequestError

SYSTEM = "Reply with the final answer as <answer>...</answer>."
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Runs Python code and returns what it prints.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]
ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)
#: What a tool output may hold at most (the rest is cut, as a sandbox cuts it).
MAX_OUTPUT = 500


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str


@dataclass
class Attempt:
    """One conversation about one problem."""

    messages: list[dict[str, Any]]
    reward: float = 0.0
    turns: int = 0
    tool_calls: int = 0
    done: bool = False


@dataclass
class Outcome:
    """A problem's attempts, as the agent scored them."""

    problem: Problem
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [a.reward for a in self.attempts]


def problems(count: int, seed: int) -> list[Problem]:
    """``count`` modular powers: easy with ``pow(a, b, m)``, out of reach by guessing."""
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        base, exponent, modulus = rng.randint(2, 99), rng.randint(10, 999), rng.randint(10, 9999)
        question = f"What is {base} to the power {exponent}, modulo {modulus}?"
        made.append(Problem(question, str(pow(base, exponent, modulus))))
    return made


def run_python(code: str, timeout_s: float = 5.0) -> str:
    """The tool: ``code`` in an isolated interpreter, its output (or why there is none)."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return f"error: timed out after {timeout_s:g} s"
    output = done.stdout if done.returncode == 0 else f"error: {done.stderr.strip()}"
    return output[:MAX_OUTPUT]


def reward_of(text: str, problem: Problem) -> float:
    found = ANSWER.findall(text)
    return 1.0 if found and found[-1].strip() == problem.answer else 0.0


async def ask(
    client: AsyncOpenAI, model: str, messages: list[dict[str, Any]], *, n: int, stream: bool
) -> list[dict[str, Any]]:
    """The assistant messages of ``n`` choices, as the agent sends them back."""
    if not stream:
        reply = await client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            n=n,  # type: ignore[arg-type]
        )
        return [c.message.model_dump(exclude_none=True) for c in reply.choices]
    chunks = await client.chat.completions.create(
        model=model,
        messages=messages,
        tools=TOOLS,
        n=n,
        stream=True,  # type: ignore[arg-type]
    )
    built: dict[int, dict[str, Any]] = {}
    async for chunk in chunks:
        for choice in chunk.choices:
            _merge(built.setdefault(choice.index, {"role": "assistant"}), choice.delta)
    return [built[i] for i in sorted(built)]


def _merge(message: dict[str, Any], delta: Any) -> None:
    """Add one streamed delta to the message being built."""
    if delta.content:
        message["content"] = message.get("content", "") + delta.content
    for call in delta.tool_calls or []:
        calls = message.setdefault("tool_calls", [])
        while len(calls) <= call.index:
            calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        target = calls[call.index]
        target["id"] = call.id or target["id"]
        if call.function is not None:
            target["function"]["name"] += call.function.name or ""
            target["function"]["arguments"] += call.function.arguments or ""


def act(attempt: Attempt, message: dict[str, Any], problem: Problem) -> None:
    """Take one assistant turn: run its tool calls, or score its final answer."""
    attempt.messages.append(message)
    attempt.turns += 1
    calls = message.get("tool_calls") or []
    if not calls:
        attempt.reward = reward_of(message.get("content") or "", problem)
        attempt.done = True
        return
    for call in calls:
        try:
            code = json.loads(call["function"]["arguments"]).get("code", "")
        except (json.JSONDecodeError, AttributeError):
            code = ""
        output = run_python(code) if code else "error: the call has no code"
        attempt.tool_calls += 1
        attempt.messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})


async def solve(
    client: AsyncOpenAI,
    model: str,
    problem: Problem,
    *,
    attempts: int,
    max_turns: int,
    stream: bool,
) -> Outcome:
    """Every attempt at one problem, each to its final answer or its last turn."""
    start = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem.question}]
    outcome = Outcome(problem, [Attempt(messages=list(start)) for _ in range(attempts)])
    for attempt, message in zip(
        outcome.attempts, await ask(client, model, start, n=attempts, stream=stream), strict=True
    ):
        act(attempt, message, problem)
    for _ in range(max_turns - 1):
        going = [a for a in outcome.attempts if not a.done]
        if not going:
            break
        replies = await asyncio.gather(*(_next_turn(client, model, a, stream) for a in going))
        for attempt, message in zip(going, replies, strict=True):
            if message is not None:
                act(attempt, message, problem)
    return outcome


async def _next_turn(
    client: AsyncOpenAI, model: str, attempt: Attempt, stream: bool
) -> dict[str, Any] | None:
    """The attempt's next assistant turn; None when the server refuses to go on (the
    conversation outgrew the model's context): the attempt ends unanswered."""
    try:
        [message] = await ask(client, model, attempt.messages, n=1, stream=stream)
    except BadRequestError:
        attempt.done = True
        return None
    return message


async def reward(client: AsyncOpenAI, session: str, rewards: Sequence[float]) -> Any:
    """Close the session on Temper's gateway: its trajectories, in the order they began
    (the first call's choices), get these rewards."""
    return await client.post(
        f"/temper/sessions/{session}/reward", body={"rewards": list(rewards)}, cast_to=object
    )


async def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    total = 0.0
    for index, problem in enumerate(problems(args.problems, args.seed)):
        session = f"{args.session_prefix}-{index}"
        async with AsyncOpenAI(
            base_url=args.base_url,
            api_key=args.api_key,
            default_headers={"X-Temper-Session": session},
            max_retries=0,
            timeout=args.timeout,
        ) as client:
            outcome = await solve(
                client,
                args.model,
                problem,
                attempts=args.attempts,
                max_turns=args.max_turns,
                stream=args.stream,
            )
            if not args.no_reward:
                await reward(client, session, outcome.rewards)
        mean = sum(outcome.rewards) / len(outcome.rewards)
        total += mean
        line = {
            "problem": index,
            "elapsed_s": round(time.monotonic() - started, 1),
            "reward": mean,
            "tool_calls": sum(a.tool_calls for a in outcome.attempts),
            "turns": sum(a.turns for a in outcome.attempts),
        }
        print(json.dumps(line), flush=True)
    print(f"mean reward {total / max(args.problems, 1):.3f} over {args.problems} problems")
    return 0


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8400/v1")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", default="temper-policy")
    parser.add_argument("--problems", type=int, default=20)
    parser.add_argument("--attempts", type=int, default=4, help="attempts per problem (n)")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stream", action="store_true", help="stream every answer (SSE)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per call")
    parser.add_argument("--session-prefix", default="openai-agent")
    parser.add_argument("--no-reward", action="store_true", help="post no reward (any server)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
