"""The cad_parts domains, scored through the running validator and sandbox services on the
real sandbox image (OpenSCAD renders the STL inside it; the validator measures it).

Skips without Docker, unless CI=true or TEMPER_REQUIRE_DOCKER=1, where it fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from protocol.messages import ScoreStatus, Task
from services.domains import DomainRegistry, Example
from services.domains.cad import SHAPES, domain
from services.sandbox.service import SandboxService
from services.validator import ValidatorService
from tests.integration.support import client
from tests.integration.test_validator_sandbox import Stack, sandbox_settings, wait_warm
from tests.integration.test_validator_service import (
    make_rollout,
    publish,
    scored_results,
    settings,
)
from tests.unit.test_cad_preview import assert_a_picture

#: Per shape: a text change to the reference that breaks one constraint, and its check.
PLANTED = {
    "plate": ("d = h[2]", "d = h[2] - 1", "hole 1 at"),
    "gear": (
        "translate([0, 0, -1]) cylinder(h",
        "translate([0, 0, -1]) scale(1.3) cylinder(h",
        "bore: diameter",
    ),
    "box": ("]) cube([", " + 1]) cube([", "floor"),
}


@pytest.fixture
async def stack(nats_url: str, tmp_path: Path, sandbox_image: str) -> AsyncIterator[Stack]:
    registry = DomainRegistry([domain(f"cad-{shape}", {"shape": shape}) for shape in SHAPES])
    sandbox = SandboxService(sandbox_settings(nats_url, sandbox_image, tmp_path))
    validator = ValidatorService(
        settings(nats_url, sandbox_grace_s=30.0, sandbox_timeout_s=30.0), domains=registry
    )
    async with sandbox, validator, client(nats_url) as nc:
        await wait_warm(sandbox, 2)
        yield Stack(sandbox, validator, nc.jetstream())


def fenced(code: str) -> str:
    return f"```openscad\n{code}```"


def candidates(shape: str, example: Example) -> dict[str, str]:
    """The reference, the reference with one planted mistake, and one that does not parse."""
    code = example.reference.removeprefix("```openscad\n").removesuffix("```")
    old, new, _ = PLANTED[shape]
    assert old in code, code
    broken = code[: code.rindex("}")]  # the last closing brace gone
    return {
        "right": fenced(code),
        "wrong": fenced(code.replace(old, new, 1)),
        "broken": fenced(broken),
    }


async def test_references_score_one_and_planted_mistakes_score_less_for_their_reason(
    stack: Stack,
) -> None:
    # All nine at once: the two warm sandboxes render side by side.
    for shape in SHAPES:
        example = domain(f"cad-{shape}", {"shape": shape}).examples(1, seed=2)[0]
        for label, completion in candidates(shape, example).items():
            task: Task = msgspec.structs.replace(example.task, id=f"{shape}-{label}")
            await publish(stack.js, make_rollout(task, completion))
    results = await scored_results(stack.js, 3 * len(SHAPES), timeout_s=90)
    by_id = {scored.rollout.task.id: scored for scored in results}
    for shape in SHAPES:
        right, wrong, broken = (by_id[f"{shape}-{label}"] for label in ("right", "wrong", "broken"))
        assert (right.status, right.reward) == (ScoreStatus.SCORED, 1.0), right.details
        _, _, reason = PLANTED[shape]
        assert wrong.status is ScoreStatus.SCORED and wrong.reward < 1.0, wrong.details
        assert reason in wrong.details[0].message, wrong.details
        # A part that does not render is a 0 to train on, not a way out of the penalty.
        assert (broken.status, broken.reward) == (ScoreStatus.SCORED, 0.0), broken.details
        assert "Parser error" in broken.details[0].message, broken.details


async def test_a_held_out_part_comes_back_with_a_preview_of_its_render(stack: Stack) -> None:
    # The real OpenSCAD render of a reference gear, drawn by the validator from the STL.
    part = domain("cad-gear", {"shape": "gear"})
    heldout, train = part.examples(1, "eval")[0], part.examples(1, "train")[0]
    await publish(stack.js, make_rollout(heldout.task, heldout.reference))
    await publish(stack.js, make_rollout(train.task, train.reference))
    results = await scored_results(stack.js, 2, timeout_s=90)
    by_split = {scored.rollout.task.metadata["split"]: scored for scored in results}
    shown = by_split["eval"].details[0]
    assert (shown.status, shown.score) == (ScoreStatus.SCORED, 1.0), shown
    assert_a_picture(shown.preview)
    assert by_split["train"].details[0].preview is None  # the default: held-out parts only
