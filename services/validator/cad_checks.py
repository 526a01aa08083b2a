"""The constraints a rendered part must meet, each a named pass or fail.

A part's spec (``task.metadata["part"]``, made by :mod:`services.domains.cad_parts`)
says its shape and dimensions; :func:`check_part` measures the mesh against it and
returns one :class:`Check` per constraint, the failed ones saying what was measured
and what was expected ("hole 2 diameter 5.00 mm, expected 6.00 +- 0.2").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from services.validator import cad_geometry as geo

if TYPE_CHECKING:
    import trimesh

#: Samples on the circle through the teeth: enough for a tooth to span several.
_TOOTH_SAMPLES: Final = 720


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


def plate_checks(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> list[Check]:
    size, tolerance = spec["size"], spec["tolerance_mm"]
    checks = closed_checks(mesh, spec, len(spec["holes"]))
    checks.append(box_bounds(mesh, size, tolerance))
    for number, (x, y, diameter) in enumerate(spec["holes"], start=1):
        checks.extend(hole_checks(mesh, number, (x, y, diameter), size[2], tolerance))
    return checks


def hole_checks(
    mesh: trimesh.Trimesh,
    number: int,
    hole: tuple[float, float, float],
    thickness: float,
    tolerance: float,
) -> list[Check]:
    """A through-hole along z: its centre, then its diameter, both within ``tolerance``."""
    x, y, diameter = hole
    position, size = f"hole {number} position", f"hole {number} diameter"
    if geo.material_at(mesh, np.array([[x, y]]), thickness)[0]:
        missing = f"hole {number} missing: material at ({x:g}, {y:g}) all the way through"
        return [_fails(position, missing), _fails(size, missing)]
    cx, cy, found = geo.bore(mesh, x, y, thickness / 2)
    centred = _near(cx, x, tolerance) and _near(cy, y, tolerance)
    where = f"hole {number} centre ({cx:.2f}, {cy:.2f}), expected ({x:g}, {y:g}) +- {tolerance:g}"
    width = f"hole {number} diameter {found:.2f} mm, expected {diameter:.2f} +- {tolerance:g}"
    return [Check(position, centred, where), Check(size, _near(found, diameter, tolerance), width)]


def gear_checks(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> list[Check]:
    tolerance, thickness = spec["tolerance_mm"], spec["thickness"]
    checks = closed_checks(mesh, spec, 1)
    checks.append(gear_size(mesh, spec))
    checks.append(teeth_check(mesh, spec))
    checks.extend(hole_checks(mesh, 1, (0.0, 0.0, spec["bore"]), thickness, tolerance))
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
    """Teeth met on the circle halfway up them, by vertical rays all around it."""
    radius = spec["root_diameter"] / 2 + spec["tooth_height"] / 2
    around = geo.circle_directions(_TOOTH_SAMPLES)[:, :2] * radius
    teeth = geo.runs_around(geo.material_at(mesh, around, spec["thickness"]))
    expected = spec["teeth"]
    message = f"{teeth} teeth at radius {radius:.2f} mm, expected {expected}"
    return Check("teeth", teeth == expected, message)


def enclosure_checks(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> list[Check]:
    checks = closed_checks(mesh, spec, 0)
    checks.append(box_bounds(mesh, spec["size"], spec["tolerance_mm"]))
    checks.append(wall_check(mesh, spec))
    checks.append(floor_check(mesh, spec))
    checks.append(open_top_check(mesh, spec))
    return checks


def _thickness(mesh: trimesh.Trimesh, origin: list[float], direction: list[float]) -> float:
    """How far a ray from outside runs through material before it leaves (inf: never enters)."""
    hits = geo.ray_hits(mesh, np.array([origin], dtype=np.float64), np.array([direction]))[0]
    return float(hits[1] - hits[0]) if len(hits) >= 2 else float("inf")


def wall_check(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> Check:
    """Each side wall, probed at mid-height off the centre (clear of triangle diagonals)."""
    (x, y, z), wall, tolerance = spec["size"], spec["wall"], spec["tolerance_mm"]
    h, px, py = 0.47 * z, 0.43 * x, 0.57 * y
    probes = {
        "-x": ([-5.0, py, h], [1.0, 0.0, 0.0]),
        "+x": ([x + 5.0, py, h], [-1.0, 0.0, 0.0]),
        "-y": ([px, -5.0, h], [0.0, 1.0, 0.0]),
        "+y": ([px, y + 5.0, h], [0.0, -1.0, 0.0]),
    }
    wrong = []
    for side, (origin, direction) in probes.items():
        found = _thickness(mesh, origin, direction)
        if not _near(found, wall, tolerance):
            wrong.append(f"{side} wall {found:.2f} mm thick")
    message = ", ".join(wrong) + f", expected {wall:g} +- {tolerance:g}"
    return Check("walls", not wrong, message)


def floor_check(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> Check:
    (x, y, _), wall, tolerance = spec["size"], spec["wall"], spec["tolerance_mm"]
    found = _thickness(mesh, [0.41 * x, 0.59 * y, -5.0], [0.0, 0.0, 1.0])
    message = f"floor {found:.2f} mm thick, expected {wall:g} +- {tolerance:g}"
    return Check("floor", _near(found, wall, tolerance), message)


def open_top_check(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> Check:
    """A ray down into the middle meets the floor first, not a lid."""
    (x, y, z), wall, tolerance = spec["size"], spec["wall"], spec["tolerance_mm"]
    top = z + 5.0
    hits = geo.ray_hits(mesh, np.array([[0.41 * x, 0.59 * y, top]]), np.array([[0.0, 0, -1]]))[0]
    surface = top - float(hits[0]) if len(hits) else float("nan")
    message = f"from above, the first surface inside is at z = {surface:.2f}, expected {wall:g}"
    return Check("open top", _near(surface, wall, tolerance), message)


SHAPES: Final[Mapping[str, Callable[[trimesh.Trimesh, Mapping[str, Any]], list[Check]]]] = {
    "plate": plate_checks,
    "gear": gear_checks,
    "box": enclosure_checks,
}


def check_part(mesh: trimesh.Trimesh, spec: Mapping[str, Any]) -> list[Check]:
    """Every constraint of ``spec`` measured on ``mesh``; KeyError for an unknown shape."""
    return SHAPES[spec["shape"]](mesh, spec)
