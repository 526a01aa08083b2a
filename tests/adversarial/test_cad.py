"""CAD cheats through the real sandbox (OpenSCAD renders each model) and the real validator.

Every cheat of :mod:`tests.adversarial.cad_cheats` for each shape scores no more than the
work it does, every model that does not render scores 0 as ``scored`` (trained on, never a
way out), and each shape's reference still scores 1.0.

Skips without Docker, unless CI=true or TEMPER_REQUIRE_DOCKER=1, where it fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from protocol.messages import ScoredRollout, ScoreStatus
from services.domains import DomainRegistry, Example
from services.domains.cad import SHAPES, domain
from services.sandbox.service import SandboxService
from services.validator import ValidatorService
from tests.adversarial import cad_cheats
from tests.integration.support import client
from tests.integration.test_validator_sandbox import Stack, sandbox_settings, wait_warm
from tests.integration.test_validator_service import (
    make_rollout,
    publish,
    scored_results,
    settings,
)

#: The render limit of these domains (the language's most): a part takes seconds alone, far
#: more beside other renders on a busy 2-core machine.
RENDER_S = 60.0
#: Per cheat, the most it may score.  The pads, bands and thin teeth keep the volume and
#: the probed spots right, yet get their features wrong over most of their extent; the
#: second body leaves the part itself right (a share of its checks, halved twice).
CEILINGS = {
    "main": 0.1,
    "shell": 0.05,
    "same volume": 0.05,
    "offset": 0.05,
    "scaled": 0.05,
    "two bodies": 0.25,
}
#: Renders sent at once.
WAVE = 4
MAIN = {"plate": cad_cheats.plate_band, "gear": cad_cheats.gear_thin, "box": cad_cheats.box_pads}


@pytest.fixture
async def stack(nats_url: str, tmp_path: Path, sandbox_image: str) -> AsyncIterator[Stack]:
    parts = [
        domain(f"cad-{shape}", {"shape": shape, "level": 2, "timeout_s": RENDER_S})
        for shape in SHAPES
    ]
    sandbox = SandboxService(sandbox_settings(nats_url, sandbox_image, tmp_path))
    validator = ValidatorService(
        settings(nats_url, sandbox_grace_s=30.0, sandbox_timeout_s=30.0),
        domains=DomainRegistry(parts),
    )
    async with sandbox, validator, client(nats_url) as nc:
        await wait_warm(sandbox, 2)
        yield Stack(sandbox, validator, nc.jetstream())


def example(shape: str) -> Example:
    return domain(f"cad-{shape}", {"shape": shape, "level": 2}).examples(1, seed=5)[0]


def task_id(shape: str, name: str) -> str:
    return f"{shape}-{name.replace(' ', '_')}"


def models(shape: str) -> dict[str, str]:
    """The reference, each cheat and each model that does not render, by name."""
    found = example(shape)
    spec = found.task.metadata["part"]
    reference = found.reference.removeprefix("```openscad\n").removesuffix("```")
    cheats = {"reference": reference, "main": MAIN[shape](spec)}
    cheats |= {name: make(spec) for name, make in cad_cheats.SPEC_CHEATS.items()}
    cheats |= {name: make(reference) for name, make in cad_cheats.REFERENCE_CHEATS.items()}
    # First: the test sends it ahead of the rest.
    slow = {"render timeout": cad_cheats.SLOW} if shape == "plate" else {}
    return slow | cheats | cad_cheats.UNRENDERED


@pytest.mark.timeout(420)  # 25 renders; a busy 2-core machine takes minutes
async def test_cheats_score_no_more_than_their_work_and_references_score_one(
    stack: Stack,
) -> None:
    rollouts = [
        make_rollout(
            msgspec.structs.replace(example(shape).task, id=task_id(shape, name)),
            f"```openscad\n{code}```",
        )
        for shape in SHAPES
        for name, code in models(shape).items()
    ]
    # The render that runs to its time limit first, the rest a few at a time beside it:
    # every render gets its share of the CPU within its limit (the sandbox starts a
    # container per request beyond its warm ones).
    slow, rest = rollouts[0], rollouts[1:]
    await publish(stack.js, slow)
    for begin in range(0, len(rest), WAVE):
        for rollout in rest[begin : begin + WAVE]:
            await publish(stack.js, rollout)
        await scored_results(stack.js, min(begin + WAVE, len(rest)), timeout_s=120)
    results = await scored_results(stack.js, len(rollouts), timeout_s=120)
    by_id: dict[str, ScoredRollout] = {scored.rollout.task.id: scored for scored in results}
    for shape in SHAPES:
        reference = by_id[task_id(shape, "reference")]
        assert (reference.status, reference.reward) == (ScoreStatus.SCORED, 1.0), reference.details
        for name, ceiling in CEILINGS.items():
            cheat = by_id[task_id(shape, name)]
            assert cheat.status is ScoreStatus.SCORED, (name, cheat.details)
            assert cheat.reward <= ceiling, (shape, name, cheat.reward, cheat.details)
        for name in set(models(shape)) - {"reference", *CEILINGS}:
            broken = by_id[task_id(shape, name)]
            # Not rendering is the candidate's doing: a 0 it is trained on.
            assert (broken.status, broken.reward) == (ScoreStatus.SCORED, 0.0), (
                name,
                broken.details,
            )
            assert "render" in broken.details[0].message or "STL" in broken.details[0].message
    # The three cheats that scored 1.0 on point probes, each told what is wrong where.
    said = {shape: by_id[task_id(shape, "main")].details[0].message for shape in SHAPES}
    assert "diameter 1.00-" in said["plate"] and "material inside the bore" in said["plate"]
    assert "tooth width 0.40-" in said["gear"] and "teeth not solid" in said["gear"]
    assert "wall not solid over its height" in said["box"]
    assert all("volume IoU" in message for message in said.values())
