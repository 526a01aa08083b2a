"""Closed meshes of the three cad_parts shapes, built point by point with numpy and trimesh.

No CSG engine: a plate and a gear are 2D triangulations extruded along z (side walls
on the boundary edges); the open box is its 28 triangles.  Neighbouring pieces share
their boundary points exactly, so the merged mesh is watertight.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import trimesh

Point = tuple[float, float]
Triangle = tuple[Point, Point, Point]


def _ccw(triangle: Triangle) -> Triangle:
    (ax, ay), (bx, by), (cx, cy) = triangle
    cross = (bx - ax) * (cy - ay) - (by - ay) * (cx - ax)
    return triangle if cross > 0 else (triangle[0], triangle[2], triangle[1])


def extrude(triangles: list[Triangle], height: float) -> trimesh.Trimesh:
    """A prism of the 2D region: top, bottom, and a wall on every boundary edge."""
    flat = [_ccw(t) for t in triangles]
    faces: list[list[tuple[float, float, float]]] = []
    for a, b, c in flat:
        faces.append([(*a, height), (*b, height), (*c, height)])
        faces.append([(*a, 0.0), (*c, 0.0), (*b, 0.0)])
    edges = [(t[i], t[(i + 1) % 3]) for t in flat for i in range(3)]
    unordered = Counter(frozenset(edge) for edge in edges)
    for a, b in edges:
        if unordered[frozenset((a, b))] == 1:  # a boundary edge, region on its left
            faces.append([(*a, 0.0), (*b, 0.0), (*b, height)])
            faces.append([(*a, 0.0), (*b, height), (*a, height)])
    return _mesh(faces)


def _mesh(faces: list[list[tuple[float, float, float]]]) -> trimesh.Trimesh:
    # Rounded so that points computed two ways (a tile's edge, its neighbour's) merge.
    triangles = np.round(np.array(faces, dtype=np.float64), 9)
    return trimesh.Trimesh(**trimesh.triangles.to_kwargs(triangles), process=True)


def _square_ring(x0: float, y0: float, side: float, per_side: int) -> list[Point]:
    """Points around a square, counter-clockwise from its lower-left corner."""
    steps = [side * i / per_side for i in range(per_side)]
    return (
        [(x0 + s, y0) for s in steps]
        + [(x0 + side, y0 + s) for s in steps]
        + [(x0 + side - s, y0 + side) for s in steps]
        + [(x0, y0 + side - s) for s in steps]
    )


def _strip(inner: list[Point], outer: list[Point]) -> list[Triangle]:
    """Triangles between two closed rings of as many points."""
    count = len(inner)
    found: list[Triangle] = []
    for i in range(count):
        j = (i + 1) % count
        found += [(inner[i], outer[i], outer[j]), (inner[i], outer[j], inner[j])]
    return found


def tile(
    x0: float, y0: float, side: float, hole: float | None, per_side: int = 8
) -> list[Triangle]:
    """A square tile, solid (a fan) or with a round hole of diameter ``hole`` at its centre."""
    ring = _square_ring(x0, y0, side, per_side)
    centre = (x0 + side / 2, y0 + side / 2)
    if hole is None:
        return [(centre, ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]
    # The hole's points sit on the rays to the ring's points: a strip without crossings.
    circle = []
    for x, y in ring:
        angle = math.atan2(y - centre[1], x - centre[0])
        circle.append(
            (centre[0] + hole / 2 * math.cos(angle), centre[1] + hole / 2 * math.sin(angle))
        )
    return _strip(circle, ring)


def plate(
    columns: int, rows: int, side: float, thickness: float, holes: dict[tuple[int, int], float]
) -> trimesh.Trimesh:
    """Tiles ``side`` mm square; ``holes`` maps a tile (column, row) to its hole's diameter."""
    triangles: list[Triangle] = []
    for column in range(columns):
        for row in range(rows):
            triangles += tile(column * side, row * side, side, holes.get((column, row)))
    return extrude(triangles, thickness)


def gear(
    teeth: int, root: float, width: float, height: float, bore: float, thickness: float
) -> trimesh.Trimesh:
    """Rectangular bars on a disc with a bore; the disc's points include each bar's base."""
    radius, half = root / 2, math.asin(width / root)
    angles: list[float] = []
    for k in range(teeth):
        centre = 2 * math.pi * k / teeth
        gap_end = 2 * math.pi * (k + 1) / teeth - half
        angles += [centre - half, centre + half]
        angles += list(np.linspace(centre + half, gap_end, 8)[1:-1])
    outer = [(radius * math.cos(a), radius * math.sin(a)) for a in angles]
    inner = [(bore / 2 * math.cos(a), bore / 2 * math.sin(a)) for a in angles]
    triangles = _strip(inner, outer)
    for k in range(teeth):
        base_a, base_b = outer[k * 8], outer[k * 8 + 1]
        axis = 2 * math.pi * k / teeth
        tip = radius + height
        along, across = (math.cos(axis), math.sin(axis)), (-math.sin(axis), math.cos(axis))
        corner_b = (tip * along[0] + width / 2 * across[0], tip * along[1] + width / 2 * across[1])
        corner_a = (tip * along[0] - width / 2 * across[0], tip * along[1] - width / 2 * across[1])
        triangles += [(base_a, corner_a, corner_b), (base_a, corner_b, base_b)]
    return extrude(triangles, thickness)


def open_box(x: float, y: float, z: float, wall: float) -> trimesh.Trimesh:
    """Outer box, inner cavity open at the top, and the rim between them."""
    o = [(0.0, 0.0), (x, 0.0), (x, y), (0.0, y)]
    i = [(wall, wall), (x - wall, wall), (x - wall, y - wall), (wall, y - wall)]
    faces: list[list[tuple[float, float, float]]] = []
    faces += _quad([(*o[0], 0), (*o[3], 0), (*o[2], 0), (*o[1], 0)])  # bottom, facing -z
    faces += _quad([(*i[0], wall), (*i[1], wall), (*i[2], wall), (*i[3], wall)])  # floor, +z
    for k in range(4):
        n = (k + 1) % 4
        faces += _quad([(*o[k], 0), (*o[n], 0), (*o[n], z), (*o[k], z)])  # outer walls
        faces += _quad([(*i[n], wall), (*i[k], wall), (*i[k], z), (*i[n], z)])  # inner walls
        faces += _quad([(*o[k], z), (*o[n], z), (*i[n], z), (*i[k], z)])  # rim, +z
    return _mesh(faces)


def _quad(corners: list[tuple[float, float, float]]) -> list[list[tuple[float, float, float]]]:
    a, b, c, d = corners
    return [[a, b, c], [a, c, d]]
