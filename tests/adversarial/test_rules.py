"""Cheats on the rule validators (math answers), through the running validator service:
hedging with many numbers, ranges, the question echoed back, nested or unclosed tags.
Only one final number counts, and only when it is the reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.messages import ScoreStatus
from services.domains import load_registry
from services.validator import ValidatorService
from tests.integration.support import client
from tests.integration.test_validator_service import (
    make_rollout,
    publish,
    scored_results,
    settings,
)


def cheats(question: str, answer: str) -> dict[str, tuple[str, float]]:
    """name -> (completion, the most it deserves)."""
    value = int(answer)
    every = " ".join(str(n) for n in range(40))
    return {
        "the reference": (f"<answer>{answer}</answer>", 1.0),
        "every number at once": (f"<answer>{every}</answer>", 0.0),
        "two guesses in one answer": (f"<answer>{value} or {value + 1}</answer>", 0.0),
        "a range": (f"<answer>{value - 1}-{value + 1}</answer>", 0.0),
        "the question echoed": (f"<answer>{question.rstrip('=')}</answer>", 0.0),
        "a right answer then a wrong one": (f"<answer>{value}</answer><answer>0</answer>", 0.0),
        "nested tags": (f"<answer><answer>{value}</answer></answer>", 0.0),
        "an unclosed tag": (f"<answer>{value}", 0.0),
        "no tag": (answer, 0.0),
        "hex": (f"<answer>{value:#x}</answer>", 0.0),
    }


#: The mix run's own domains (its JSONL stories are judged by the math validator too).
MIX_DOMAINS = Path(__file__).resolve().parents[2] / "deploy" / "runs" / "domains" / "mix.toml"


@pytest.mark.parametrize(("config", "name"), [(None, "arithmetic_sum3"), (MIX_DOMAINS, "stories")])
async def test_math_cheats_score_no_more_than_they_deserve(
    nats_url: str, config: Path | None, name: str
) -> None:
    domain = load_registry(config, plugins=False).get(name)
    task = domain.make_tasks(1, "eval", seed=0)[0]
    cases = cheats(task.prompt[-1].content, str(task.metadata["answer"]))
    service = ValidatorService(settings(nats_url, domains_config=config))
    async with service, client(nats_url) as nc:
        js = nc.jetstream()
        for index, (text, _) in enumerate(cases.values()):
            await publish(js, make_rollout(task, text, index=index))
        results = await scored_results(js, len(cases))
    got = {s.rollout.sample_index: s for s in results}
    for index, (name, (_, deserved)) in enumerate(cases.items()):
        assert got[index].status is ScoreStatus.SCORED, name
        assert got[index].reward <= deserved, (name, got[index].details)
    assert got[0].reward == 1.0
