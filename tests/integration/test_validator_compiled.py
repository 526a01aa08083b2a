"""The cpp_functions and js_functions domains, scored through the running validator and
sandbox services on the real sandbox image (g++ and node inside it).

Skips without Docker, unless CI=true or TEMPER_REQUIRE_DOCKER=1, where it fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from protocol.messages import ScoredRollout, ScoreStatus
from services.domains import DomainRegistry
from services.domains.compiled_functions import LANGUAGES, domain
from services.sandbox.service import SandboxService
from services.validator import ValidatorService
from tests.integration.support import client
from tests.integration.test_validator_sandbox import Stack, sandbox_settings, wait_warm
from tests.integration.test_validator_service import settings

#: Per language: a candidate that passes some tests at most, one that does not compile,
#: and what its details must then say.
PLANTED = {
    "cpp": ("int digit_sum(int n) { return n % 7; }", "int digit_sum(int n) {", "error"),
    "js": ("function digit_sum(n) { return n % 7; }", "function digit_sum(n) {", "SyntaxError"),
}


@pytest.fixture
async def stack(nats_url: str, tmp_path: Path, sandbox_image: str) -> AsyncIterator[Stack]:
    functions = [domain(f"{lang}_functions", {"language": lang}) for lang in LANGUAGES]
    registry = DomainRegistry(functions)
    sandbox = SandboxService(sandbox_settings(nats_url, sandbox_image, tmp_path))
    # A compile takes seconds: the validator waits for the domain's time limit and more.
    validator = ValidatorService(
        settings(nats_url, sandbox_grace_s=30.0, sandbox_timeout_s=20.0), domains=registry
    )
    async with sandbox, validator, client(nats_url) as nc:
        await wait_warm(sandbox, 2)
        yield Stack(sandbox, validator, nc.jetstream())


def fenced(language: str, code: str) -> str:
    return f"```{language}\n{code}\n```"


@pytest.mark.parametrize("language", ["cpp", "js"])
async def test_reference_scores_one_and_planted_mistakes_score_less(
    stack: Stack, language: str
) -> None:
    functions = domain(f"{language}_functions", {"language": language})
    example = next(
        e for e in functions.examples(40, seed=1) if ":digit_sum:" in e.task.metadata["key"]
    )

    async def score(completion: str, label: str) -> ScoredRollout:
        task = msgspec.structs.replace(example.task, id=f"{language}-{label}")
        return await stack.score(completion, label, task=task)

    right = await score(example.reference, "right")
    assert (right.status, right.reward) == (ScoreStatus.SCORED, 1.0), right.details
    wrong_code, broken_code, says = PLANTED[language]
    wrong = await score(fenced(language, wrong_code), "wrong")
    assert wrong.status is ScoreStatus.SCORED and wrong.reward < 1.0, wrong.details
    broken = await score(fenced(language, broken_code), "broken")
    assert (broken.status, broken.reward) == (ScoreStatus.SCORED, 0.0), broken.details
    assert says in broken.details[0].message and "stderr:" in broken.details[0].message
