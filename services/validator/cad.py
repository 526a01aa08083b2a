"""OpenSCAD parts: render the candidate to STL in the sandbox, measure the mesh here.

reward = share of the part's constraints met x 1/2 per constraint failed
(:mod:`services.validator.cad_checks`): one wrong feature of ten keeps 0.45, two 0.2, so
a part right only where one check looks earns little.  The details name each failed
constraint with what was measured and what was expected.  A
candidate that does not render (an OpenSCAD error, an empty model, no STL, a render past
its time or memory limit) or renders a mesh that cannot be read scores 0, with
OpenSCAD's own message, and is trained on: not rendering must never be a way out of a
low score.  Only failures of the machinery (sandbox infra_error, no sandbox, no answer)
are InfraFailure, as for unit tests.

A rendered part may also get a small PNG preview (:mod:`services.validator.cad_preview`)
for evaluation reports: held-out rollouts only by default (``TEMPER_VALIDATOR_CAD_PREVIEWS``),
as training rollouts are never looked at and drawing costs tens of milliseconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from protocol.errors import ErrorCode
from protocol.messages import Rollout, SandboxExec, SandboxLimits, SandboxResult, SandboxStatus
from services.domains.api import is_heldout
from services.validator import extract
from services.validator.base import InfraFailure, InvalidRollout, Verdict, reference
from services.validator.cad_checks import SHAPES, Check, check_part
from services.validator.cad_columns import TooComplex
from services.validator.cad_geometry import MeshError, load_stl
from services.validator.cad_preview import render_preview
from services.validator.cad_reference import reference_solid
from services.validator.sandbox import Sandbox, SandboxRejected
from services.validator.settings import PreviewMode

if TYPE_CHECKING:
    import trimesh

#: Where the sandbox's ``openscad`` language writes the render.
STL: Final = "out.stl"
#: What OpenSCAD said, at most this much, in an unrenderable candidate's details.
MESSAGE_CHARS: Final = 400
#: Each failed constraint halves the share of those met.
FAILED_FACTOR: Final = 0.5


def render_error(result: SandboxResult) -> str:
    """Why a run left no STL, in OpenSCAD's words where it gave any (its ERROR lines first)."""
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if "ERROR" in line or "WARNING" in line]
    said = "\n".join(errors or lines[-5:])[:MESSAGE_CHARS]
    if result.status is SandboxStatus.OK:
        # The sandbox leaves out an output over the request's output_bytes.
        return f"OpenSCAD left no STL (or one over the output limit): {said or 'no message'}"
    return f"OpenSCAD did not render ({result.status}): {said or result.error or 'no message'}"


def verdict(checks: list[Check]) -> Verdict:
    failed = [check.message for check in checks if not check.ok]
    passed = len(checks) - len(failed)
    if not failed:
        return Verdict(1.0, f"all {len(checks)} checks passed")
    score = passed / len(checks) * FAILED_FACTOR ** len(failed)
    return Verdict(score, f"{passed}/{len(checks)} checks passed; " + "; ".join(failed))


def part_spec(rollout: Rollout) -> Mapping[str, Any]:
    """The task's part spec; InvalidRollout if it is missing or no solid can be built from it
    (the task's fault, not the candidate's)."""
    spec = reference(rollout.task, "part")
    if not isinstance(spec, Mapping) or spec.get("shape") not in SHAPES:
        raise InvalidRollout(f"task {rollout.task.id}: metadata['part'] is not a part spec")
    try:
        reference_solid(spec)
        float(spec["tolerance_mm"]), float(spec["volume"]), float(spec["volume_tolerance"])
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise InvalidRollout(f"task {rollout.task.id}: malformed part spec: {error!r}") from None
    return spec


def measure(stl: bytes, spec: Mapping[str, Any], preview: bool = False) -> Verdict:
    """The checks on the rendered mesh, and its picture if ``preview`` (CPU work: run it
    off the event loop)."""
    try:
        mesh: trimesh.Trimesh = load_stl(stl)
        judged = verdict(check_part(mesh, spec))
    except (MeshError, TooComplex) as error:
        return Verdict(0.0, f"the render cannot be measured: {error}")
    if not preview:
        return judged
    return Verdict(judged.score, judged.message, render_preview(mesh))


def wants_preview(mode: PreviewMode, rollout: Rollout) -> bool:
    return mode == "all" or (mode == "heldout" and is_heldout(rollout.task))


@dataclass(frozen=True)
class CadPart:
    sandbox: Sandbox
    limits: SandboxLimits
    #: Request timeout = the render's time limit + this (start-up, queueing, the reply).
    grace_s: float
    #: Used when the domain sets no time limit (the sandbox service then applies its own).
    default_timeout_s: float
    #: Which rendered parts get a PNG preview in their details.
    previews: PreviewMode = "heldout"

    async def score(self, rollout: Rollout) -> Verdict:
        spec = part_spec(rollout)
        text = rollout.completion_text
        code = extract.code_block(text, "openscad") or extract.code_block(text, "scad")
        if code is None:
            return Verdict(0.0, "no ```openscad code block")
        result = await self._render(rollout.id, code)
        if isinstance(result, Verdict):
            return result
        if result.status is SandboxStatus.INFRA_ERROR:
            raise InfraFailure(f"sandbox infrastructure error: {result.error or 'no detail'}")
        stl = result.outputs.get(STL)
        if result.status is not SandboxStatus.OK or stl is None:
            return Verdict(0.0, render_error(result))
        preview = wants_preview(self.previews, rollout)
        return await asyncio.to_thread(measure, stl, spec, preview)

    async def _render(self, rollout_id: str, code: str) -> SandboxResult | Verdict:
        request = SandboxExec(
            id=f"validate-{rollout_id}",
            language="openscad",
            code=code,
            limits=self.limits,
            outputs=[STL],
        )
        timeout_s = (self.limits.timeout_s or self.default_timeout_s) + self.grace_s
        try:
            return await self.sandbox.run(request, timeout_s)
        except SandboxRejected as error:
            if error.code is ErrorCode.TOO_LARGE:
                return Verdict(0.0, f"candidate refused: {error.message}")
            raise InfraFailure(str(error)) from None
