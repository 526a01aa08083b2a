"""The reference part as an exact solid, built here from the task's spec.

Every ``cad_parts`` shape is a union of prisms (a 2D rectangle or disc extruded along z)
less other prisms: a plate is a block less its holes, a gear a disc and its teeth less the
bore, a box a block less its cavity.  So the reference needs no mesh and no CSG engine: its
signed distance and containment are exact formulas, and its surface is sampled on the
prisms' faces, keeping the points where the solid's inside and outside meet.  Nothing of
it comes from the candidate or the sandbox.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]
#: How far a cavity reaches past the part's top: it is open, never capped.
_OPEN: Final = 1e4
#: Step off a sampled face to tell the solid's inside from its outside.
_STEP: Final = 1e-4


@dataclass(frozen=True)
class Shape2D:
    """A rectangle ``[x0, x1] x [y0, y1]`` (turned by ``turn`` about the origin), or a disc."""

    kind: str  # "rect" or "disc"
    params: tuple[float, float, float, float]  # rect: x0, y0, x1, y1; disc: cx, cy, r, 0
    turn: float = 0.0

    def _local(self, xy: Array) -> Array:
        c, s = math.cos(self.turn), math.sin(self.turn)
        return np.column_stack([c * xy[:, 0] + s * xy[:, 1], -s * xy[:, 0] + c * xy[:, 1]])

    def _world(self, xy: Array) -> Array:
        c, s = math.cos(self.turn), math.sin(self.turn)
        return np.column_stack([c * xy[:, 0] - s * xy[:, 1], s * xy[:, 0] + c * xy[:, 1]])

    def distance(self, xy: Array) -> Array:
        """Exact signed distance to the outline (negative inside)."""
        if self.kind == "disc":
            cx, cy, r, _ = self.params
            return np.asarray(np.hypot(xy[:, 0] - cx, xy[:, 1] - cy) - r)
        x0, y0, x1, y1 = self.params
        local = self._local(xy)
        centre, half = np.array([x0 + x1, y0 + y1]) / 2, np.array([x1 - x0, y1 - y0]) / 2
        q = np.abs(local - centre) - half
        outside = np.hypot(np.maximum(q[:, 0], 0), np.maximum(q[:, 1], 0))
        return np.asarray(outside + np.minimum(np.maximum(q[:, 0], q[:, 1]), 0.0))

    def area(self) -> float:
        if self.kind == "disc":
            return math.pi * self.params[2] ** 2
        x0, y0, x1, y1 = self.params
        return (x1 - x0) * (y1 - y0)

    def perimeter(self) -> float:
        if self.kind == "disc":
            return 2 * math.pi * self.params[2]
        x0, y0, x1, y1 = self.params
        return 2 * ((x1 - x0) + (y1 - y0))

    def inner(self, rng: np.random.Generator, count: int) -> Array:
        """Points uniform inside the outline."""
        u = rng.random((count, 2))
        if self.kind == "disc":
            cx, cy, r, _ = self.params
            radius, angle = r * np.sqrt(u[:, 0]), 2 * np.pi * u[:, 1]
            return np.column_stack([cx + radius * np.cos(angle), cy + radius * np.sin(angle)])
        x0, y0, x1, y1 = self.params
        return self._world(np.column_stack([x0 + u[:, 0] * (x1 - x0), y0 + u[:, 1] * (y1 - y0)]))

    def outline(self, rng: np.random.Generator, count: int) -> tuple[Array, Array]:
        """Points uniform on the outline, and the outward normals there."""
        u = rng.random(count)
        if self.kind == "disc":
            cx, cy, r, _ = self.params
            normal = np.column_stack([np.cos(2 * np.pi * u), np.sin(2 * np.pi * u)])
            return np.array([cx, cy]) + r * normal, normal
        x0, y0, x1, y1 = self.params
        w, h = x1 - x0, y1 - y0
        s = u * 2 * (w + h)
        sides = np.searchsorted(np.cumsum([w, h, w, h]), s, side="right").clip(0, 3)
        along = s - np.concatenate(([0.0], np.cumsum([w, h, w])))[sides]
        starts = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])
        steps = np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1]])
        normals = np.array([[0.0, -1], [1, 0], [0, 1], [-1, 0]])
        points = starts[sides] + steps[sides] * along[:, None]
        return self._world(points), self._world(normals[sides])


@dataclass(frozen=True)
class Prism:
    """A 2D shape extruded from ``z0`` to ``z1``."""

    shape: Shape2D
    z0: float
    z1: float

    def distance(self, points: Array) -> Array:
        """Exact signed distance of an extrusion from its 2D one and the slab's."""
        d = self.shape.distance(points[:, :2])
        dz = np.maximum(self.z0 - points[:, 2], points[:, 2] - self.z1)
        inside = np.minimum(np.maximum(d, dz), 0.0)
        return np.asarray(inside + np.hypot(np.maximum(d, 0.0), np.maximum(dz, 0.0)))

    def faces(
        self, rng: np.random.Generator, density: float, low: float, high: float
    ) -> tuple[Array, Array]:
        """Points on the faces (within z ``low``-``high``), about ``density`` per mm^2."""
        z0, z1 = max(self.z0, low), min(self.z1, high)
        found_p, found_n = [], []
        for z, up in ((self.z0, -1.0), (self.z1, 1.0)):
            if low <= z <= high:
                count = int(np.ceil(density * self.shape.area()))
                xy = self.shape.inner(rng, count)
                found_p.append(np.column_stack([xy, np.full(count, z)]))
                found_n.append(np.tile([0.0, 0.0, up], (count, 1)))
        if z1 > z0:
            count = int(np.ceil(density * self.shape.perimeter() * (z1 - z0)))
            xy, normal = self.shape.outline(rng, count)
            found_p.append(np.column_stack([xy, z0 + rng.random(count) * (z1 - z0)]))
            found_n.append(np.column_stack([normal, np.zeros(count)]))
        return np.concatenate(found_p), np.concatenate(found_n)


@dataclass(frozen=True)
class Solid:
    """The union of ``adds`` less the union of ``cuts``."""

    adds: tuple[Prism, ...]
    cuts: tuple[Prism, ...] = field(default=())

    def distance(self, points: Array) -> Array:
        """Signed distance to the surface (exact but in the corners where pieces meet,
        where it may come out a little short)."""
        added: Array = np.min([prism.distance(points) for prism in self.adds], axis=0)
        if not self.cuts:
            return added
        cut = np.min([prism.distance(points) for prism in self.cuts], axis=0)
        return np.asarray(np.maximum(added, -cut))

    def contains_grid(self, xy: Array, zs: Array) -> Mask:
        """Inside or not, at every (column ``xy``, height ``zs``) pair: shape (columns, zs)."""

        def any_of(prisms: tuple[Prism, ...]) -> Mask:
            found = np.zeros((len(xy), len(zs)), dtype=bool)
            for prism in prisms:
                found |= (prism.shape.distance(xy) < 0)[:, None] & (
                    (zs >= prism.z0) & (zs <= prism.z1)
                )[None, :]
            return found

        return any_of(self.adds) & ~any_of(self.cuts)

    def bounds(self) -> Array:
        """[[x, y, z] low, [x, y, z] high] of the added prisms (the cuts only remove)."""
        boxes = []
        for prism in self.adds:
            xy, _ = prism.shape.outline(np.random.default_rng(0), 256)
            boxes.append([[*xy.min(axis=0), prism.z0], [*xy.max(axis=0), prism.z1]])
        found = np.array(boxes)
        return np.array([found[:, 0].min(axis=0), found[:, 1].max(axis=0)])

    def surface(self, count: int, seed: int = 0) -> Array:
        """About ``count`` points uniform on the surface, the same ones for the same solid."""
        rng = np.random.default_rng(seed)
        low, high = self.bounds()[:, 2]
        prisms = (*self.adds, *self.cuts)
        area = sum(p.shape.area() * 2 + p.shape.perimeter() * (p.z1 - p.z0) for p in prisms)
        density = 3.0 * count / area  # a third or more of the points fall on no surface
        kept: list[Array] = []
        for number, prism in enumerate(prisms):
            points, normals = prism.faces(rng, density, low, high)
            inner = self.distance(points - _STEP * normals) < 0
            outer = self.distance(points + _STEP * normals) > 0
            # A face two prisms share (a tooth's top on the disc's) is sampled once.
            earlier = [abs(p.distance(points)) < 1e-9 for p in prisms[:number]]
            twice = np.any(earlier, axis=0) if earlier else np.zeros(len(points), bool)
            kept.append(points[inner & outer & ~twice])
        found = np.concatenate(kept)
        return found[rng.permutation(len(found))[:count]]


def _rect(x0: float, y0: float, x1: float, y1: float, turn: float = 0.0) -> Shape2D:
    return Shape2D("rect", (x0, y0, x1, y1), turn)


def _disc(cx: float, cy: float, diameter: float) -> Shape2D:
    return Shape2D("disc", (cx, cy, diameter / 2, 0.0))


def plate(spec: Mapping[str, Any]) -> Solid:
    length, width, thickness = (float(v) for v in spec["size"])
    holes = tuple(
        Prism(_disc(float(x), float(y), float(d)), -1.0, thickness + 1) for x, y, d in spec["holes"]
    )
    return Solid((Prism(_rect(0, 0, length, width), 0.0, thickness),), holes)


def gear(spec: Mapping[str, Any]) -> Solid:
    thickness, root = float(spec["thickness"]), float(spec["root_diameter"])
    width, tip = float(spec["tooth_width"]), root / 2 + float(spec["tooth_height"])
    teeth = int(spec["teeth"])
    bars = tuple(
        Prism(_rect(0, -width / 2, tip, width / 2, 2 * math.pi * k / teeth), 0.0, thickness)
        for k in range(teeth)
    )
    bore = Prism(_disc(0, 0, float(spec["bore"])), -1.0, thickness + 1)
    return Solid((Prism(_disc(0, 0, root), 0.0, thickness), *bars), (bore,))


def box(spec: Mapping[str, Any]) -> Solid:
    (x, y, z), wall = (float(v) for v in spec["size"]), float(spec["wall"])
    cavity = Prism(_rect(wall, wall, x - wall, y - wall), wall, z + _OPEN)
    return Solid((Prism(_rect(0, 0, x, y), 0.0, z),), (cavity,))


BUILDERS: Final = {"plate": plate, "gear": gear, "box": box}


def reference_solid(spec: Mapping[str, Any]) -> Solid:
    """The part ``spec`` describes; KeyError, TypeError or ValueError for a malformed one."""
    return BUILDERS[spec["shape"]](spec)
