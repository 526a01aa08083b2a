"""Parts described in words, written in OpenSCAD, judged on the rendered mesh.

A problem is one part of :mod:`services.domains.cad_parts` (a drilled plate, a toothed
disc, an open box).  The ``cad`` validator renders the candidate to STL in the sandbox
and measures the mesh: bounding box, volume, watertightness, through-holes, the shape's
own features over their whole extent (holes along their depth, teeth, root, walls,
floor), and the whole shape against the reference solid built from the spec.  The score
is the share of constraints met, halved for each one failed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from protocol.messages import SandboxLimits
from services.domains.api import Domain, Problem, PromptFormat, ValidatorSpec
from services.domains.cad_parts import MAKERS, SEGMENTS, part_key
from services.domains.params import Params

SHAPES: Final = tuple(MAKERS)
SYSTEM: Final = (
    "Write an OpenSCAD model of the part described, in millimetres. Reply with one "
    "```openscad code block; it must render to a single closed solid. Use "
    f"$fn = {SEGMENTS} (or finer) for round features."
)
#: Problems per (shape, level, scale): far more than any run draws.
_VARIANTS: Final = 100_000
#: The judge's time limit beyond the render's: start-up, the sandbox's grace, the reply,
#: and measuring a part rendered just in time.
_JUDGE_SLACK_S: Final = 30.0
#: An ASCII STL of a part with a few 64-gon holes is a few hundred kB; leave room.
_STL_BYTES: Final = 8 << 20


@dataclass(frozen=True)
class PartSource:
    shape: str
    level: int
    scale: int
    tolerance_mm: float
    volume_tolerance: float

    def draw(self, rng: random.Random) -> Problem:
        seed = f"cad:{self.shape}:l{self.level}:x{self.scale}:{rng.randrange(_VARIANTS)}"
        # Dimensions follow from the seed alone: one seed is one part, whatever the caller's
        # rng.  Many seeds draw the same part, so the key is the part's, not the seed's.
        part = MAKERS[self.shape](random.Random(seed), self.level, self.scale)
        spec = {
            **part.spec,
            "tolerance_mm": self.tolerance_mm,
            "volume_tolerance": self.volume_tolerance,
        }
        question = (
            f"{part.description}\nLengths must be within {self.tolerance_mm:g} mm and the "
            f"volume within {self.volume_tolerance:.0%}."
        )
        return Problem(
            key=f"cad:{part_key(part.spec)}",
            question=question,
            metadata={"part": spec},
            reference=f"```openscad\n{part.reference}```",
        )


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, params)
    shape = read.choice("shape", "plate", SHAPES)
    level = read.integer("level", 1, 1, 4)
    scale = read.integer("scale", 1, 1, 4)
    tolerance_mm = read.number("tolerance_mm", 0.2, 0.01, 5.0)
    volume_tolerance = read.number("volume_tolerance", 0.02, 0.001, 0.5)
    timeout_s = read.number("timeout_s", 30.0, 1.0, 120.0)
    read.done()
    return Domain(
        name=name,
        kind="cad_parts",
        source=PartSource(shape, level, scale, tolerance_mm, volume_tolerance),
        prompt=PromptFormat(system=SYSTEM),
        # The judge waits out the render, the sandbox's answer and the measuring: a slow
        # render must end as the candidate's timeout (a 0), never as the judge's own
        # (infra_failure, which drops the rollout and counts against the domain).
        validators=(
            ValidatorSpec(
                kind="cad", name="geometry", params={"timeout_s": timeout_s + _JUDGE_SLACK_S}
            ),
        ),
        # OpenSCAD's language defaults (memory, processes), a render time limit, and
        # room for the STL coming back.
        sandbox=SandboxLimits(timeout_s=timeout_s, output_bytes=_STL_BYTES),
        max_tokens=768,
        description=f"OpenSCAD {shape}s, level {level}, scale x{scale}",
    )
