"""OpenSCAD a policy could write to earn CAD rewards without making the part.

Each maker takes a part spec (``task.metadata["part"]``) and returns a model.  The first
three are exact only where single rays used to probe, with a pocket or a lump elsewhere to
keep the volume; the others are wrong in ways a volume or a bounding box alone misses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

Spec = Mapping[str, Any]
#: Band of the full diameter left at mid-depth in a narrowed hole.
BAND = 0.6


def _g(value: float) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".")


def plate_band(spec: Spec) -> str:
    """Holes of diameter 1 with the full diameter only in a 0.6 mm band at mid-depth; blind
    pockets from below, clear of the holes, give back the material the narrow holes add."""
    (length, width, thickness), holes = spec["size"], spec["holes"]
    extra = sum(math.pi / 4 * (d * d - 1) * (thickness - BAND) for _, _, d in holes)
    depth = thickness * 0.45
    side = 5.0
    spots = [
        (x, y)
        for x in range(2, int(length) - 7, 6)
        for y in range(2, int(width) - 7, 6)
        if all(math.dist((x + side / 2, y + side / 2), h[:2]) > h[2] / 2 + 4 for h in holes)
    ]
    count = min(len(spots), math.ceil(extra / (side * side * depth)))
    pockets = "".join(
        f"    translate([{x}, {y}, -1]) cube([{side}, {side}, {_g(depth + 1)}]);\n"
        for x, y in spots[:count]
    )
    middle = thickness / 2 - BAND / 2
    drilled = "".join(
        f"    translate([{x}, {y}, -1]) cylinder(h = {thickness + 2}, d = 1);\n"
        f"    translate([{x}, {y}, {_g(middle)}]) cylinder(h = {BAND}, d = {d});\n"
        for x, y, d in holes
    )
    return (
        f"$fn = 64;\ndifference() {{\n    cube([{length}, {width}, {thickness}]);\n"
        f"{drilled}{pockets}}}\n"
    )


def gear_thin(spec: Spec) -> str:
    """Teeth 0.4 mm wide; the disc grown by less than half a tooth keeps the volume."""
    teeth, root, height = spec["teeth"], spec["root_diameter"], spec["tooth_height"]
    thickness, bore, width = spec["thickness"], spec["bore"], spec["tooth_width"]
    lost = teeth * (width - 0.4) * height
    grown = min(math.sqrt(root * root / 4 + lost / math.pi) * 2, root + height - 0.6)
    return (
        "$fn = 64;\ndifference() {\n    union() {\n"
        f"        cylinder(h = {thickness}, d = {_g(grown)});\n"
        f"        for (i = [0 : {teeth - 1}]) rotate([0, 0, i * 360 / {teeth}])\n"
        f"            translate([0, -0.2, 0]) cube([{_g(root / 2 + height)}, 0.4, {thickness}]);\n"
        f"    }}\n    translate([0, 0, -1]) cylinder(h = {thickness + 2}, d = {bore});\n}}\n"
    )


def box_pads(spec: Spec) -> str:
    """Walls half as thick, full-thickness pads where rays used to probe them, and a
    floor thickened to keep the volume (with a well where it used to be probed)."""
    (x, y, z), wall = spec["size"], spec["wall"]
    thin = wall / 2
    inner = (x - 2 * thin) * (y - 2 * thin)
    lost = 2 * (x + y) * (z - wall) * thin - 4 * thin * thin * (z - wall)
    floor = wall + lost / inner
    h, px, py = 0.47 * z, 0.43 * x, 0.57 * y
    pads = "".join(
        f"    translate([{_g(a)}, {_g(b)}, {_g(h - 2)}]) cube([{_g(sx)}, {_g(sy)}, 4]);\n"
        for a, b, sx, sy in (
            (0, py - 2, wall, 4),
            (x - wall, py - 2, wall, 4),
            (px - 2, 0, 4, wall),
            (px - 2, y - wall, 4, wall),
        )
    )
    well = f"translate([{_g(0.41 * x - 1)}, {_g(0.59 * y - 1)}, {_g(wall)}]) cube([2, 2, {z}]);"
    return (
        f"union() {{\n    difference() {{\n        cube([{x}, {y}, {z}]);\n"
        f"        translate([{_g(thin)}, {_g(thin)}, {_g(floor)}]) "
        f"cube([{_g(x - 2 * thin)}, {_g(y - 2 * thin)}, {z}]);\n"
        f"        {well}\n    }}\n{pads}}}\n"
    )


def shell(spec: Spec) -> str:
    """A closed shell the size of the part's bounding box (a lid on the box)."""
    x, y, z = _extent(spec)
    return (
        f"difference() {{\n    cube([{x}, {y}, {z}]);\n"
        f"    translate([1, 1, 1]) cube([{x - 2}, {y - 2}, {z - 2}]);\n}}\n"
    )


def same_volume(spec: Spec) -> str:
    """A cube of the part's volume."""
    return f"cube({_g(spec['volume'] ** (1 / 3))});\n"


def offset(reference: str) -> str:
    return f"translate([0.6, 0.6, 0]) {{\n{reference}}}\n"


def scaled(reference: str) -> str:
    return f"scale(1.04) {{\n{reference}}}\n"


def two_bodies(reference: str) -> str:
    return f"{reference}translate([-20, -20, 0]) cube(3);\n"


def _extent(spec: Spec) -> tuple[float, float, float]:
    if "size" in spec:
        size = spec["size"]
        return float(size[0]), float(size[1]), float(size[2])
    reach = spec["root_diameter"] + 2 * spec["tooth_height"]
    return float(reach), float(reach), float(spec["thickness"])


#: Models that do not render: each must score 0 and be trained on.
UNRENDERED = {
    "syntax error": "cube([10, 10, 10]\n",
    "empty model": "difference() { cube(1); cube(2, center = true); }\n",
}
#: Renders for minutes (CGAL differences of fine spheres): stopped at the time limit.
SLOW = "$fn = 400;\ndifference() { sphere(10); for (i = [0:6]) translate([i, 0, 0]) sphere(9); }\n"

SPEC_CHEATS: dict[str, Callable[[Spec], str]] = {
    "shell": shell,
    "same volume": same_volume,
}
REFERENCE_CHEATS: dict[str, Callable[[str], str]] = {
    "offset": offset,
    "scaled": scaled,
    "two bodies": two_bodies,
}
