"""The constraints a rendered part must meet, each a named pass or fail.

A part's spec (``task.metadata["part"]``, made by :mod:`services.domains.cad_parts`)
says its shape and dimensions; :func:`check_part` measures the mesh against it and
returns one :class:`Check` per constraint, the failed ones saying what was measured
and what was expected ("hole 2: diameter 1.00-6.00 mm over its depth, expected 6.00 +- 0.2").

Besides the part's body (closed, one piece, its through-holes, volume, bounds), each feature
is checked over its whole extent (:mod:`cad_features`) and the whole shape is compared with
the reference solid built from the spec (:mod:`cad_reference`, :mod:`cad_shape`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from services.validator import cad_geometry as geo
from services.validator.cad_columns import TooComplex, columns
from services.validator.cad_features import Box, Extent, Gear, bore, root_extent, teeth_extent
from services.validator.cad_reference import reference_solid
from services.validator.cad_shape import compare

if TYPE_CHECKING:
    import trimesh

#: Samples on the circle through the teeth: enough for a tooth to span several.
_TOOTH_SAMPLES: Final = 720
#: The whole shape matches the reference when the volume IoU is at least this, and the
#: Chamfer and 95th percentile surface distances are within these many ``tolerance_mm``.
MIN_IOU: Final = 0.95
CHAMFER_TOLERANCES: Final = 0.5
HAUSDORFF_TOLERANCES: Final = 2.0
#: A mesh of more triangles is not measured (an ASCII STL within the domain's 8 MiB holds
#: about 40 000; a part at $fn = 64 a few thousand).
MAX_TRIANGLES: Final = 60_000


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    #: What was wrong (empty when it passed).
    message: str = ""


def _fails(name: str, message: str) -> Check:
    return Check(name, False, message)


def _near(value: float, expected: float, tolerance: float) -> bool:
    return abs(value - expected) <= tolerance


def _mm(values: Any) -> str:
    return "[" + ", ".join(f"{float(v):.2f}" for v in values) + "]"


def closed_checks(mesh: trimesh.Trimesh, spec: Mapping[str, Any], holes: int) -> list[Check]:
    """Watertight, one piece, the number of through-holes, the volume."""
    bodies = geo.body_count(mesh)
    checks = [
        Check("watertight", bool(mesh.is_watertight), "the mesh is not watertight (open edges)"),
        Check("one piece", bodies == 1, f"{bodies} separate bodies, expected one piece"),
    ]
    if not mesh.is_watertight:
        why = "not measurable: the mesh is not watertight"
        return [*checks, _fails("through-holes", why), _fails("volume", why)]
    found = geo.through_holes(mesh, bodies)
    checks.append(
        Check("through-holes", found == holes, f"{found} through-holes, expected {holes}")
    )
    volume, expected, share = abs(float(mesh.volume)), spec["volume"], spec["volume_tolerance"]
    message = f"volume {volume:.0f} mm^3, expected {expected:.0f} +- {share:.0%}"
    checks.append(Check("volume", abs(volume - expected) <= share * expected, message))
    return checks


def box_bounds(mesh: trimesh.Trimesh, size: list[float], tolerance: float) -> Check:
    """The part spans [0, size] on each axis."""
    low, high = np.asarray(mesh.bounds)
    ok = bool(np.all(np.abs(low) <= tolerance) and np.all(np.abs(high - size) <= tolerance))
    message = (
        f"bounding box {_mm(low)}-{_mm(high)} mm, expected "
        f"{_mm([0, 0, 0])}-{_mm(size)} +- {tolerance:g}"
    )
    return Check("bounding box", ok, message)


def shape_checks(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> list[Check]:
    """The whole part against the reference solid: volume overlap, surface distance."""
    tolerance = float(spec["tolerance_mm"])
    match = compare(mesh, reference_solid(spec))
    overlap = f"volume IoU with the reference {match.iou:.3f}, expected at least {MIN_IOU:g}"
    near, far = CHAMFER_TOLERANCES * tolerance, HAUSDORFF_TOLERANCES * tolerance
    distance = (
        f"surface distance to the reference: Chamfer {match.chamfer:.3f} mm (at most "
        f"{near:g}), 95th percentile {match.hausdorff95:.3f} mm (at most {far:g})"
    )
    return [
        Check("volume overlap", match.iou >= MIN_IOU, overlap),
        Check("surface distance", match.chamfer <= near and match.hausdorff95 <= far, distance),
    ]


def _extent(name: str, found: Extent) -> Check:
    return Check(name, found.ok, f"{name}: {found.message}")


def plate_checks(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> list[Check]:
    size, tolerance = spec["size"], spec["tolerance_mm"]
    checks = closed_checks(mesh, spec, len(spec["holes"]))
    checks.append(box_bounds(mesh, size, tolerance))
    for number, (x, y, diameter) in enumerate(spec["holes"], start=1):
        found = bore(mesh, (x, y, diameter), size[2], tolerance)
        checks.append(_extent(f"hole {number} at ({x:g}, {y:g})", found))
    return checks


def gear_checks(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> list[Check]:
    tolerance, thickness = spec["tolerance_mm"], spec["thickness"]
    root = spec["root_diameter"] / 2
    gear = Gear(
        spec["teeth"], root, root + spec["tooth_height"], spec["tooth_width"], thickness, tolerance
    )
    checks = closed_checks(mesh, spec, 1)
    checks.append(gear_size(mesh, spec))
    checks.append(teeth_check(mesh, spec))
    checks.append(_extent("teeth", teeth_extent(mesh, gear)))
    checks.append(_extent("root", root_extent(mesh, gear)))
    checks.append(_extent("bore", bore(mesh, (0.0, 0.0, spec["bore"]), thickness, tolerance)))
    return checks


def gear_size(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> Check:
    """Thickness along z from 0, and the outer radius (a tooth's outer corners)."""
    tolerance, thickness = spec["tolerance_mm"], spec["thickness"]
    tip = spec["root_diameter"] / 2 + spec["tooth_height"]
    corner = float(np.hypot(tip, spec["tooth_width"] / 2))
    low, high = np.asarray(mesh.bounds)[:, 2]
    reach = geo.max_radius(mesh)
    wrong = []
    if not (_near(low, 0.0, tolerance) and _near(high, thickness, tolerance)):
        wrong.append(f"z from {low:.2f} to {high:.2f} mm, expected 0 to {thickness:g}")
    if not _near(reach, corner, tolerance):
        wrong.append(f"outer radius {reach:.2f} mm, expected {corner:.2f}")
    return Check("size", not wrong, "; ".join(wrong) + f" (+- {tolerance:g})")


def teeth_check(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> Check:
    """Teeth counted on the circle halfway up them: runs of columns that meet material."""
    radius = spec["root_diameter"] / 2 + spec["tooth_height"] / 2
    around = geo.circle_directions(_TOOTH_SAMPLES)[:, :2] * radius
    teeth = geo.runs_around(~columns(mesh, around).empty())
    expected = spec["teeth"]
    message = f"{teeth} teeth at radius {radius:.2f} mm, expected {expected}"
    return Check("tooth count", teeth == expected, message)


def enclosure_checks(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> list[Check]:
    box = Box(tuple(spec["size"]), spec["wall"], spec["tolerance_mm"])
    checks = closed_checks(mesh, spec, 0)
    checks.append(box_bounds(mesh, spec["size"], spec["tolerance_mm"]))
    checks.append(_extent("walls", box.walls(mesh)))
    floor, top = box.floor(mesh)
    checks += [_extent("floor", floor), _extent("open top", top)]
    return checks


SHAPES: Final[Mapping[str, Callable[[trimesh.Trimesh, Mapping[str, Any]], list[Check]]]] = {
    "plate": plate_checks,
    "gear": gear_checks,
    "box": enclosure_checks,
}


def check_part(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> list[Check]:
    """Every constraint of ``spec`` measured on ``mesh``, the whole shape's last (KeyError
    for an unknown shape; TooComplex for a mesh too costly to measure)."""
    if len(mesh.faces) > MAX_TRIANGLES:
        raise TooComplex(f"{len(mesh.faces)} triangles, at most {MAX_TRIANGLES} are measured")
    return [*SHAPES[spec["shape"]](mesh, spec), *shape_checks(mesh, spec)]
