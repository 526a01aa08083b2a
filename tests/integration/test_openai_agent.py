"""examples/openai_agent.py, an agent written only against the official ``openai`` client,
run against the gateway with a policy that calls tools (real generator, torch engine,
real nats-server): its multi-turn conversations, streamed and not, are recorded token
for token as the engine generated them, and its rewards close each session."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from openai import AsyncOpenAI

from protocol import subjects
from protocol.codec import Codec
from protocol.messages import CallResult, Rollout, ScoredRollout
from services.gateway.service import GatewayService
from services.gateway.sessions import Trajectory
from services.gateway.settings import GatewaySettings
from services.generator.service import GeneratorService
from tests.integration.support import Tap, client, runtime
from tests.integration.test_generator_service import _settings as generator_settings

KEY = "sk-agent-0123456789abcdef"
MODEL = "temper-policy"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai_agent.py"
ATTEMPTS = 3
#: Problems tried at most until one of them sees a tool call.
MAX_PROBLEMS = 4


def load_agent() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openai_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
async def stack(nats_url: str, tool_policy: Path) -> AsyncIterator[GatewayService]:
    gateway = GatewaySettings(
        runtime=runtime(nats_url, instance="gw-agent"),
        port=0,
        model_id=MODEL,
        model=tool_policy,
        keys=json.dumps({"keys": [{"key": KEY, "tenant": "acme", "rate_per_s": 0}]}),
        call_timeout_s=60,
        max_tokens=96,
    )
    generator = generator_settings(nats_url, tool_policy, max_concurrent_tasks=4)
    async with GeneratorService(generator), GatewayService(gateway) as service:
        assert isinstance(service, GatewayService)
        yield service


def generated_by_the_engine(trajectory: Trajectory, results: list[CallResult]) -> int:
    """How many of the trajectory's trained segments are, token for token, a completion the
    engine generated for a prompt that was exactly the trajectory up to that segment."""
    samples: list[Rollout] = [r for result in results for r in result.rollouts]
    found = 0
    whole = trajectory.prompt + trajectory.completion
    for segment in trajectory.segments:
        if segment.kind != "gen":
            continue
        cut = len(trajectory.prompt) + segment.start
        prompt, completion = whole[:cut], whole[cut : len(trajectory.prompt) + segment.end]
        found += any(
            [int(i) for i in s.token_ids[: s.prompt_len]] == prompt
            and [int(i) for i in s.completion_ids] == completion
            for s in samples
        )
    return found


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_agent_loop_is_recorded_as_generated_and_rewarded(
    stack: GatewayService, nats_url: str, stream: bool
) -> None:
    agent = load_agent()
    tool_calls = published = 0
    async with client(nats_url) as nc:
        answers, scored = await _taps(nc)
        # Sampled attempts of a small policy: some problems see no well-formed call at all,
        # so problems are tried until one has (every one of them is checked all the same).
        for index, problem in enumerate(agent.problems(MAX_PROBLEMS, seed=4)):
            outcome, trajectories = await _one_problem(
                agent, stack, f"agent-{stream}-{index}", problem, stream
            )
            published += len(trajectories)
            got = (await scored.wait(published))[-len(trajectories) :]
            _check(trajectories, answers.got, got, outcome.rewards)
            tool_calls += sum(a.tool_calls for a in outcome.attempts)
            if tool_calls:
                # The policy called its tool and went on from the output: several turns.
                assert max(t.calls for t in trajectories) >= 2
                break
    assert tool_calls >= 1


async def _one_problem(
    agent: ModuleType, stack: GatewayService, session: str, problem: Any, stream: bool
) -> tuple[Any, list[Trajectory]]:
    openai = AsyncOpenAI(
        base_url=f"{stack.url}/v1",
        api_key=KEY,
        default_headers={"X-Temper-Session": session},
        max_retries=0,
        timeout=60,
    )
    outcome = await agent.solve(
        openai, MODEL, problem, attempts=ATTEMPTS, max_turns=3, stream=stream
    )
    recorded = stack.sessions.get(stack.keys.lookup(KEY).key_id, session)
    assert recorded is not None
    trajectories = [t.fork() for t in recorded.trajectories]
    await agent.reward(openai, session, outcome.rewards)
    return outcome, trajectories


def _check(
    trajectories: list[Trajectory],
    results: list[CallResult],
    published: list[ScoredRollout],
    rewards: list[float],
) -> None:
    """One trajectory per attempt, each as generated, each published with its reward."""
    assert len(trajectories) == ATTEMPTS
    for trajectory in trajectories:
        trained = sum(s.kind == "gen" for s in trajectory.segments)
        assert generated_by_the_engine(trajectory, results) == trained
        # The tool outputs and turn markers between the calls are never trained on.
        for segment in trajectory.segments:
            mask = trajectory.mask[segment.start : segment.end]
            assert set(mask) == {1 if segment.kind == "gen" else 0}
    assert [s.reward for s in published] == rewards
    for item, trajectory in zip(published, trajectories, strict=True):
        assert [int(i) for i in item.rollout.token_ids] == trajectory.prompt + trajectory.completion


async def _taps(nc: NATS) -> tuple[Tap, Tap]:
    answers, scored = Tap(Codec(CallResult)), Tap(Codec(ScoredRollout))
    await nc.subscribe(subjects.gateway_replies("gw-agent"), cb=answers.on_msg)
    await nc.subscribe(subjects.scored_all(), cb=scored.on_msg)
    await nc.flush()
    return answers, scored


def test_the_agents_tool_runs_code_and_its_reward_reads_the_final_answer() -> None:
    agent = load_agent()
    assert agent.run_python("print(pow(3, 5, 7))") == "5\n"
    assert agent.run_python("import sys; sys.exit(3)").startswith("error")
    problem = agent.Problem("3^5 mod 7?", "5")
    assert agent.reward_of("so <answer>5</answer>", problem) == 1.0
    assert agent.reward_of("<answer>5</answer> no, <answer>6</answer>", problem) == 0.0
