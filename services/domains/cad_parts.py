"""The parts of the ``cad_parts`` domains: a drilled plate, a toothed disc, an open box.

Each maker draws one part's dimensions from an rng and returns its description (the
task text), a reference OpenSCAD solution, and the spec the validator measures the
rendered mesh against (:mod:`services.validator.cad_checks`).  Dimensions are whole
(or half) millimetres, so the text states them exactly; ``level`` (1-4) adds holes
and teeth, ``scale`` multiplies the sizes.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

#: Round features: the task asks for this many segments, and the checks' diameter
#: tolerance assumes it (a 64-gon's radius is within 0.12% of the circle's).
SEGMENTS: Final = 64
#: Holes and teeth per level.
_HOLES: Final = {1: (1, 2), 2: (2, 3), 3: (3, 5), 4: (4, 6)}
_TEETH: Final = {1: (6, 10), 2: (10, 16), 3: (16, 24), 4: (24, 36)}
_DIAMETERS: Final = (3, 4, 5, 6, 8)


@dataclass(frozen=True)
class Part:
    description: str
    reference: str
    #: Everything the checks need; JSON-like (it travels in the task's metadata).
    spec: dict[str, Any]


def _g(value: float) -> str:
    return f"{value:g}"


def _between(rng: random.Random, low: int, high: int) -> int:
    # randint costs several times this: a held-out set draws tens of thousands of parts
    # (services.evaluation.heldout), most of their holes placed after a few tries.
    return low + int(rng.random() * (high - low + 1))


def _placed(rng: random.Random, size: tuple[int, int], diameters: list[int]) -> list[list[int]]:
    """Hole centres (whole mm) clear of the edges and of each other, or [] if none fit."""
    holes: list[list[int]] = []
    for diameter in diameters:
        margin = math.ceil(diameter / 2 + 2)
        for _ in range(100):
            x = _between(rng, margin, size[0] - margin)
            y = _between(rng, margin, size[1] - margin)
            if all(math.dist((x, y), h[:2]) >= (diameter + h[2]) / 2 + 3 for h in holes):
                holes.append([x, y, diameter])
                break
        else:
            return []
    return holes


def _plate_layout(rng: random.Random, level: int, scale: int) -> tuple[list[int], list[list[int]]]:
    while True:  # redraw until the holes fit: small plates with many holes sometimes fail
        size = [rng.randint(6, 16) * 5 * scale, rng.randint(4, 10) * 5 * scale, rng.randint(3, 8)]
        count = rng.randint(*_HOLES[level])
        same = rng.choice(_DIAMETERS)
        mixed = level >= 3
        diameters = [rng.choice(_DIAMETERS) if mixed else same for _ in range(count)]
        holes = _placed(rng, (size[0], size[1]), diameters)
        if holes:
            return size, holes


def plate(rng: random.Random, level: int, scale: int) -> Part:
    size, holes = _plate_layout(rng, level, scale)
    length, width, thickness = size
    listed = "; ".join(
        f"hole {i} of diameter {d} mm centred at ({x}, {y})" for i, (x, y, d) in enumerate(holes, 1)
    )
    description = (
        f"A flat rectangular plate {length} x {width} x {thickness} mm, spanning "
        f"[0, {length}] in x, [0, {width}] in y and [0, {thickness}] in z, drilled with "
        f"{len(holes)} round through-holes along z: {listed}."
    )
    rows = ", ".join(f"[{x}, {y}, {d}]" for x, y, d in holes)
    reference = (
        f"$fn = {SEGMENTS};\n"
        "difference() {\n"
        f"    cube([{length}, {width}, {thickness}]);\n"
        f"    for (h = [{rows}])\n"
        f"        translate([h[0], h[1], -1]) cylinder(h = {thickness + 2}, d = h[2]);\n"
        "}\n"
    )
    return Part(description, reference, plate_spec(size, holes))


def plate_spec(size: list[int], holes: Sequence[Sequence[float]]) -> dict[str, Any]:
    """What the validator checks of a plate ``size`` with ``holes`` ``[x, y, d]``."""
    length, width, thickness = size
    area = length * width - sum(math.pi * d * d / 4 for _, _, d in holes)
    return {"shape": "plate", "size": size, "holes": holes, "volume": area * thickness}


def tooth_area(root_radius: float, width: float, height: float) -> float:
    """Area of a tooth (a ``root + height`` by ``width`` bar from the centre) outside the disc."""
    half = width / 2
    inside = half * math.sqrt(root_radius**2 - half**2) + root_radius**2 * math.asin(
        half / root_radius
    )
    return (root_radius + height) * width - inside


def gear(rng: random.Random, level: int, scale: int) -> Part:
    teeth = rng.randint(*_TEETH[level])
    width, height = rng.choice((2, 3)) * scale, rng.choice((2, 3, 4)) * scale
    # Gaps at the root at least a tooth wide, so teeth never touch.
    root = max(20 * scale, 2 * math.ceil(teeth * 2 * width / math.pi / 2)) + 2 * rng.randint(0, 5)
    thickness = rng.randint(3, 8)
    bore = rng.choice([d for d in (4, 5, 6, 8, 10, 12) if d <= root / 2])
    description = (
        f"A flat spur-gear-like disc {thickness} mm thick (z from 0 to {thickness}), centred "
        f"on the z axis: a disc of diameter {root} mm with {teeth} rectangular teeth "
        f"evenly spaced around it, the first centred on the +x axis. Each tooth is a bar "
        f"{width} mm wide running from the centre out to {_g(root / 2 + height)} mm (so it "
        f"stands {height} mm beyond the disc). A round bore of diameter {bore} mm goes "
        "through the centre along z."
    )
    reference = (
        f"$fn = {SEGMENTS};\n"
        "difference() {\n"
        "    union() {\n"
        f"        cylinder(h = {thickness}, d = {root});\n"
        f"        for (i = [0 : {teeth - 1}])\n"
        f"            rotate([0, 0, i * 360 / {teeth}])\n"
        f"                translate([0, -{_g(width / 2)}, 0]) "
        f"cube([{_g(root / 2 + height)}, {width}, {thickness}]);\n"
        "    }\n"
        f"    translate([0, 0, -1]) cylinder(h = {thickness + 2}, d = {bore});\n"
        "}\n"
    )
    return Part(description, reference, gear_spec(teeth, root, width, height, thickness, bore))


def gear_spec(
    teeth: int, root: float, width: float, height: float, thickness: float, bore: float
) -> dict[str, Any]:
    area = math.pi * (root**2 - bore**2) / 4 + teeth * tooth_area(root / 2, width, height)
    return {
        "shape": "gear",
        "teeth": teeth,
        "root_diameter": root,
        "tooth_width": width,
        "tooth_height": height,
        "thickness": thickness,
        "bore": bore,
        "volume": area * thickness,
    }


def box(rng: random.Random, level: int, scale: int) -> Part:
    wall = rng.choice((1.5, 2, 2.5, 3, 4)[: level + 1])
    size = [rng.randint(6, 20) * 5 * scale, rng.randint(4, 16) * 5 * scale, rng.randint(3, 10) * 5]
    x, y, z = size
    description = (
        f"An open-top box enclosure with outer size {x} x {y} x {z} mm, spanning [0, {x}] "
        f"in x, [0, {y}] in y and [0, {z}] in z: four side walls and a floor, each "
        f"{_g(wall)} mm thick, and no lid (open at z = {z})."
    )
    reference = (
        "difference() {\n"
        f"    cube([{x}, {y}, {z}]);\n"
        f"    translate([{_g(wall)}, {_g(wall)}, {_g(wall)}]) "
        f"cube([{_g(x - 2 * wall)}, {_g(y - 2 * wall)}, {z}]);\n"
        "}\n"
    )
    return Part(description, reference, box_spec(size, wall))


def box_spec(size: list[int], wall: float) -> dict[str, Any]:
    x, y, z = size
    volume = x * y * z - (x - 2 * wall) * (y - 2 * wall) * (z - wall)
    return {"shape": "box", "size": size, "wall": wall, "volume": volume}


def part_key(spec: Mapping[str, Any]) -> str:
    """The part itself, whatever drew it: its shape and dimensions, holes in any order.

    Two seeds, levels or scales that draw the same solid give the same key (the split
    hashes it), and the volume is left out: it follows from the rest.
    """
    fields = {name: value for name, value in spec.items() if name != "volume"}
    if "holes" in fields:
        fields["holes"] = sorted(list(hole) for hole in fields["holes"])
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


MAKERS: Final[dict[str, Callable[[random.Random, int, int], Part]]] = {
    "plate": plate,
    "gear": gear,
    "box": box,
}
