"""The reference solid, vertical columns and the whole-shape comparison (no sandbox)."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
import pytest
import trimesh

from protocol.messages import Rollout, SandboxLimits, SandboxResult, SandboxStatus
from services.domains import cad_parts
from services.domains.cad import domain
from services.validator.base import InvalidRollout
from services.validator.cad import CadPart, measure
from services.validator.cad_columns import columns
from services.validator.cad_reference import reference_solid
from services.validator.cad_shape import compare, distance_to_mesh
from tests.unit import cad_meshes
from tests.unit.test_cad_parts import FakeSandbox

TOLERANCES = {"tolerance_mm": 0.2, "volume_tolerance": 0.02}


def gear() -> dict[str, object]:
    return {**cad_parts.gear_spec(12, 30.0, 3.0, 3.0, 4.0, 6.0), **TOLERANCES}


def test_the_reference_surface_lies_on_the_solid_and_the_solid_holds_its_inside() -> None:
    solid = reference_solid(gear())
    points = solid.surface(500)
    assert len(points) == 500
    assert np.abs(solid.distance(points)).max() < 1e-6
    inside = solid.contains_grid(
        np.array([[0.0, 0.0], [5.0, 0.0], [16.5, 0.0], [16.5, 2.0]]), np.array([-0.5, 2.0])
    )
    # The bore, the disc, a tooth, the gap beside it; below the part nothing.
    assert inside.tolist() == [[False, False], [False, True], [False, True], [False, False]]


def test_columns_give_each_crossing_and_the_material_between() -> None:
    box = cad_meshes.open_box(50, 30, 20, 2.0)
    found = columns(box, np.array([[1.0, 5.0], [10.0, 10.0], [60.0, 5.0]]))
    assert found.of(0) == pytest.approx([0.0, 20.0]) and found.of(1) == pytest.approx([0.0, 2.0])
    assert found.empty().tolist() == [False, False, True]
    assert found.solid_between(0.0, 20.0, 0.2).tolist() == [True, False, False]
    assert found.inside(np.array([1.0, 10.0])).tolist() == [
        [True, True],
        [True, False],
        [False, False],
    ]


def test_the_right_mesh_matches_and_a_moved_or_hollowed_one_does_not() -> None:
    spec = {**cad_parts.box_spec([50, 30, 20], 2.0), **TOLERANCES}
    right = compare(cad_meshes.open_box(50, 30, 20, 2.0), reference_solid(spec))
    assert right.iou > 0.999 and right.chamfer < 1e-6 and right.hausdorff95 < 1e-6
    moved = cad_meshes.open_box(50, 30, 20, 2.0)
    moved.apply_translation([1.0, 0.0, 0.0])
    off = compare(moved, reference_solid(spec))
    assert off.iou < 0.8 and off.hausdorff95 == pytest.approx(1.0, abs=0.05)


def test_distances_to_a_mesh_are_exact() -> None:
    cube = trimesh.creation.box([2, 2, 2])
    points = np.array([[0.0, 0.0, 3.0], [3.0, 3.0, 0.0], [0.5, 0.0, 0.0]])
    assert distance_to_mesh(cube, points) == pytest.approx([2.0, np.sqrt(8.0), 0.5])


def test_a_mesh_too_costly_to_measure_scores_zero() -> None:
    sphere = trimesh.creation.icosphere(subdivisions=7)  # 327 680 triangles
    judged = measure(sphere.export(file_type="stl"), gear())
    assert judged.score == 0.0 and "cannot be measured" in judged.message


def test_a_malformed_part_spec_is_the_task_s_fault() -> None:
    example = domain("cad-gear", {"shape": "gear"}).examples(1)[0]
    spec = {**example.task.metadata["part"], "teeth": "many"}
    task = msgspec.structs.replace(example.task, metadata={**example.task.metadata, "part": spec})
    rollout = Rollout(id="r/0", task=task, sample_index=0, completion_text="```openscad\n```")
    ok = SandboxResult(id="x", status=SandboxStatus.OK)
    validator = CadPart(FakeSandbox(ok), SandboxLimits(timeout_s=3.0), 1.0, 5.0)
    with pytest.raises(InvalidRollout, match="malformed part spec"):
        asyncio.run(validator.score(rollout))
