"""The cad_parts geometry checks on meshes built in trimesh (no sandbox, no OpenSCAD)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import trimesh

from protocol.errors import ErrorCode
from protocol.messages import Rollout, SandboxExec, SandboxLimits, SandboxResult, SandboxStatus
from services.domains import cad_parts
from services.domains.cad import domain
from services.validator.base import InfraFailure, Verdict
from services.validator.cad import CadPart, render_error, verdict
from services.validator.cad_checks import Check, check_part
from services.validator.cad_geometry import body_count, ray_hits, through_holes
from services.validator.sandbox import SandboxRejected
from tests.unit import cad_meshes

TOLERANCES = {"tolerance_mm": 0.2, "volume_tolerance": 0.02}
#: Plate: 6 x 4 tiles of 10 mm, 5 mm thick; hole 1 (d 6) in tile (1, 1), hole 2 (d 6) in (4, 2).
HOLES = {(1, 1): 6.0, (4, 2): 6.0}


def plate_spec() -> dict[str, Any]:
    return {**cad_parts.plate_spec([60, 40, 5], [[15, 15, 6.0], [45, 25, 6.0]]), **TOLERANCES}


def failed(checks: list[Check]) -> dict[str, str]:
    return {check.name: check.message for check in checks if not check.ok}


def test_the_right_plate_scores_one() -> None:
    mesh = cad_meshes.plate(6, 4, 10.0, 5.0, HOLES)
    assert mesh.is_watertight and through_holes(mesh, body_count(mesh)) == 2
    score = verdict(check_part(mesh, plate_spec()))
    assert (score.score, score.message) == (1.0, "all 9 checks passed")


def test_a_wrong_hole_diameter_fails_that_hole_and_halves_the_share() -> None:
    mesh = cad_meshes.plate(6, 4, 10.0, 5.0, {**HOLES, (4, 2): 5.0})
    wrong = failed(check_part(mesh, plate_spec()))
    assert set(wrong) == {"hole 2 at (45, 25)"}
    assert wrong["hole 2 at (45, 25)"].startswith("hole 2 at (45, 25): diameter 4.9")
    assert "expected 6.00 +- 0.2" in wrong["hole 2 at (45, 25)"]
    assert verdict(check_part(mesh, plate_spec())).score == pytest.approx(8 / 9 / 2)


def test_a_missing_hole_fails_its_check_the_hole_count_and_the_whole_shape() -> None:
    mesh = cad_meshes.plate(6, 4, 10.0, 5.0, {(1, 1): 6.0})
    wrong = failed(check_part(mesh, plate_spec()))
    assert {"through-holes", "hole 2 at (45, 25)"} <= set(wrong)
    assert wrong["through-holes"] == "1 through-holes, expected 2"
    assert "material inside the bore at 49 of 49 columns" in wrong["hole 2 at (45, 25)"]


def test_a_shifted_hole_fails_its_centre() -> None:
    spec = plate_spec()
    spec["holes"][0] = [15, 15.5, 6.0]
    wrong = failed(check_part(cad_meshes.plate(6, 4, 10.0, 5.0, HOLES), spec))
    assert set(wrong) == {"hole 1 at (15, 15.5)"}
    assert "centre off by up to 0.50 mm" in wrong["hole 1 at (15, 15.5)"]


def test_a_wrong_bounding_box_fails_it_the_volume_and_the_whole_shape() -> None:
    mesh = cad_meshes.plate(7, 4, 10.0, 5.0, HOLES)  # 70 mm long instead of 60
    wrong = failed(check_part(mesh, plate_spec()))
    assert set(wrong) == {"bounding box", "volume", "volume overlap", "surface distance"}
    assert "[70.00, 40.00, 5.00] mm, expected" in wrong["bounding box"]
    assert wrong["volume overlap"].startswith("volume IoU with the reference 0.8")


def test_an_open_mesh_fails_watertightness_and_what_needs_a_closed_one() -> None:
    mesh = cad_meshes.plate(6, 4, 10.0, 5.0, HOLES)
    top = np.flatnonzero(mesh.triangles_center[:, 2] > 4.9)[:3]
    mesh.update_faces(np.setdiff1d(np.arange(len(mesh.faces)), top))
    wrong = failed(check_part(mesh, plate_spec()))
    assert {"watertight", "through-holes", "volume"} <= set(wrong)
    assert wrong["volume"] == "not measurable: the mesh is not watertight"


def gear_spec(teeth: int = 12, bore: float = 6.0) -> dict[str, Any]:
    return {**cad_parts.gear_spec(teeth, 30.0, 3.0, 3.0, 4.0, bore), **TOLERANCES}


def test_the_right_gear_scores_one_and_wrong_teeth_or_bore_fail() -> None:
    mesh = cad_meshes.gear(12, 30.0, 3.0, 3.0, 6.0, 4.0)
    assert failed(check_part(mesh, gear_spec())) == {}
    wrong = failed(check_part(mesh, gear_spec(teeth=13)))
    assert wrong["tooth count"].startswith("12 teeth at radius 16.50 mm")
    wrong = failed(check_part(mesh, gear_spec(bore=8.0)))
    assert "bore" in wrong and "diameter 6.00-6.00 mm" in wrong["bore"]


def test_thin_teeth_fail_their_width_over_their_whole_length() -> None:
    mesh = cad_meshes.gear(12, 30.0, 0.4, 3.0, 6.0, 4.0)
    wrong = failed(check_part(mesh, gear_spec()))
    assert wrong["teeth"].startswith("teeth: tooth width 0.40-0.40 mm, expected 3 +- 0.2")
    assert "teeth not solid" in wrong["teeth"]
    assert {"volume overlap", "surface distance"} <= set(wrong)
    assert verdict(check_part(mesh, gear_spec())).score < 0.1


def box_spec(wall: float = 2.0) -> dict[str, Any]:
    return {**cad_parts.box_spec([50, 30, 20], wall), **TOLERANCES}


def test_the_right_box_scores_one_and_thin_walls_fail() -> None:
    assert failed(check_part(cad_meshes.open_box(50, 30, 20, 2.0), box_spec())) == {}
    wrong = failed(check_part(cad_meshes.open_box(50, 30, 20, 1.5), box_spec()))
    assert {"walls", "floor", "volume", "volume overlap"} <= set(wrong)
    assert wrong["walls"].startswith("walls: wall thickness 1.50-1.50 mm, expected 2 +- 0.2")
    assert "wall not solid over its height" in wrong["walls"]


def test_a_closed_box_fails_open_top() -> None:
    closed = trimesh.creation.box([50, 30, 20])
    closed.apply_translation([25, 15, 10])
    wrong = failed(check_part(closed, box_spec()))
    assert "open top" in wrong and "walls" in wrong


def test_rays_report_each_crossing_once_even_through_a_shared_edge() -> None:
    cube = trimesh.creation.box([2, 2, 2])
    # Straight down through the centre: on the diagonal the top and bottom faces share.
    hits = ray_hits(cube, np.array([[0.0, 0.0, 5.0]]), np.array([[0.0, 0.0, -1.0]]))[0]
    assert hits.tolist() == pytest.approx([4.0, 6.0])


@pytest.mark.parametrize("shape", ["plate", "gear", "box"])
def test_the_domains_describe_their_part_and_keep_its_spec(shape: str) -> None:
    part = domain(f"cad-{shape}", {"shape": shape, "level": 4, "scale": 2})
    train, heldout = part.make_tasks(3, "train"), part.make_tasks(3, "eval")
    assert {t.metadata["key"] for t in train}.isdisjoint(t.metadata["key"] for t in heldout)
    spec = train[0].metadata["part"]
    assert spec["shape"] == shape and spec["tolerance_mm"] == 0.2 and spec["volume"] > 0
    assert "OpenSCAD" in train[0].prompt[0].content
    assert part.examples(1)[0].reference.startswith("```openscad\n")
    # The judge outlasts the render: a slow render is the candidate's 0, not infra_failure.
    slow = domain(f"cad-{shape}", {"shape": shape, "timeout_s": 90})
    assert slow.validators[0].params["timeout_s"] >= (slow.sandbox.timeout_s or 0) + 30
    again = domain(f"cad-{shape}", {"shape": shape, "level": 4, "scale": 2})
    assert again.make_tasks(3, "train") == train  # the key alone decides the part


class FakeSandbox:
    """Answers every render with one result (or one refusal)."""

    def __init__(self, result: SandboxResult | SandboxRejected) -> None:
        self.result = result
        self.requests: list[SandboxExec] = []

    async def run(self, request: SandboxExec, timeout_s: float) -> SandboxResult:
        self.requests.append(request)
        if isinstance(self.result, SandboxRejected):
            raise self.result
        return self.result


def render(
    result: SandboxResult | SandboxRejected, text: str = "```openscad\ncube(1);\n```"
) -> Any:
    example = domain("cad-box", {"shape": "box"}).examples(1)[0]
    rollout = Rollout(id="r/0", task=example.task, sample_index=0, completion_text=text)
    sandbox = FakeSandbox(result)
    validator = CadPart(sandbox, SandboxLimits(timeout_s=3.0), grace_s=1.0, default_timeout_s=5.0)
    return asyncio.run(validator.score(rollout)), sandbox.requests


def test_the_validator_renders_in_the_sandbox_and_maps_its_failures() -> None:
    stl = trimesh.creation.box([1, 1, 1]).export(file_type="stl")
    scored, requests = render(
        SandboxResult(id="x", status=SandboxStatus.OK, outputs={"out.stl": stl})
    )
    assert 0 < scored.score < 1 and "bounding box" in scored.message
    assert (requests[0].language, requests[0].outputs, requests[0].code) == (
        "openscad",
        ["out.stl"],
        "cube(1);\n",
    )
    said = "ERROR: Parser error: syntax error in file a.scad, line 1"
    failed = SandboxResult(
        id="x", status=SandboxStatus.NONZERO_EXIT, exit_code=1, stderr=f"noise\n{said}\n"
    )
    # Not rendering is the candidate's doing: a 0 it is trained on, never a way out.
    unrendered = render(failed)[0]
    assert unrendered.score == 0.0
    assert "did not render (nonzero_exit): ERROR: Parser error" in unrendered.message
    empty = SandboxResult(
        id="x", status=SandboxStatus.OK, stderr="Current top level object is empty."
    )
    assert render(empty)[0] == Verdict(0.0, render_error(empty))
    assert "left no STL" in render(empty)[0].message
    for status in (SandboxStatus.TIMEOUT, SandboxStatus.OOM, SandboxStatus.OUTPUT_LIMIT):
        assert render(SandboxResult(id="x", status=status))[0].score == 0.0
    garbage = SandboxResult(id="x", status=SandboxStatus.OK, outputs={"out.stl": b"solid x\n"})
    assert render(garbage)[0].score == 0.0
    assert "cannot be measured" in render(garbage)[0].message
    with pytest.raises(InfraFailure, match="container vanished"):
        render(SandboxResult(id="x", status=SandboxStatus.INFRA_ERROR, error="container vanished"))
    with pytest.raises(InfraFailure, match="unavailable"):
        render(SandboxRejected(ErrorCode.UNAVAILABLE, "no sandbox free"))
    assert render(SandboxRejected(ErrorCode.TOO_LARGE, "code too big"))[0].score == 0.0
    assert render(SandboxResult(id="x", status=SandboxStatus.OK), text="no code")[0].score == 0.0
