"""Vertical rays through a mesh at many (x, y) points at once: where each meets the surface.

A vertical ray is a point in the xy plane, so the triangles are rasterised instead of cast
against: the points go into grid cells, each triangle is tried only on the points of the
cells its shadow covers.  One pass answers thousands of columns in tens of milliseconds,
which is what checking a feature over its whole extent (every column through a hole, a
tooth, a wall) and the volume overlap need.  Along a column of a closed mesh the material
is between crossings 1 and 2, 3 and 4, and so on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import trimesh

Array = npt.NDArray[np.float64]
Index = npt.NDArray[np.int64]
#: (triangle, point) pairs tried at most, over all: past it a mesh is too costly to measure.
MAX_PAIRS: Final = 40_000_000
#: Pairs per batch (memory bound).
_BATCH: Final = 2_000_000
#: Crossings closer than this along one column are one (a column through a shared edge).
_SAME: Final = 1e-6
#: Columns are moved by this much off the round coordinates of the parts, where a column
#: would run exactly along an edge between two triangles.
_NUDGE: Final = np.array([1.37e-5, 2.91e-5])


class TooComplex(ValueError):
    """The mesh would take too long to measure (far more triangles than any part needs)."""


@dataclass(frozen=True)
class Columns:
    """Per column, its sorted crossing heights: ``heights[start[i]:start[i + 1]]``."""

    heights: Array
    start: Index

    def of(self, column: int) -> Array:
        return self.heights[self.start[column] : self.start[column + 1]]

    def counts(self) -> Index:
        return np.diff(self.start)

    def inside(self, zs: Array) -> npt.NDArray[np.bool_]:
        """Material at each height of ``zs`` in each column (odd crossings below it)."""
        column = np.repeat(np.arange(len(self.start) - 1), np.diff(self.start))
        span = float(np.ptp(np.concatenate([self.heights, zs]))) + 1.0
        low = float(min(self.heights.min(initial=0.0), zs.min())) - 1.0
        keys = column + (self.heights - low) / span / 2
        queries = np.arange(len(self.start) - 1)[:, None] + (zs[None, :] - low) / span / 2
        below = np.searchsorted(keys, queries) - self.start[:-1, None]
        return np.asarray(below % 2 == 1)

    def solid_between(self, low: float, high: float, tolerance: float) -> npt.NDArray[np.bool_]:
        """Columns that are one piece of material from ``low`` to ``high`` and no more."""
        counts = self.counts()
        if not len(self.heights):
            return np.zeros(len(counts), dtype=bool)
        first = self.heights[np.minimum(self.start[:-1], len(self.heights) - 1)]
        last = self.heights[np.maximum(self.start[1:] - 1, 0)]
        return np.asarray(
            (counts == 2) & (np.abs(first - low) <= tolerance) & (np.abs(last - high) <= tolerance)
        )

    def empty(self) -> npt.NDArray[np.bool_]:
        return np.asarray(self.counts() == 0)


def columns(mesh: trimesh.Trimesh, xy: Array) -> Columns:
    """Where the vertical line through each of ``xy`` crosses the surface of ``mesh``."""
    xy = np.asarray(xy, dtype=np.float64) + _NUDGE
    triangles = np.asarray(mesh.triangles, dtype=np.float64)
    flat = triangles[:, :, :2]
    e1, e2 = flat[:, 1] - flat[:, 0], flat[:, 2] - flat[:, 0]
    doubled = e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0]
    triangles = triangles[np.abs(doubled) > 1e-12]  # walls along z cast no shadow
    tri, point = _pairs(triangles, xy)
    heights, owners = [], []
    for begin in range(0, len(tri), _BATCH):
        part = slice(begin, begin + _BATCH)
        z, hit = _crossing(triangles[tri[part]], xy[point[part]])
        heights.append(z[hit])
        owners.append(point[part][hit])
    return _grouped(np.concatenate(heights or [np.zeros(0)]), _ints(owners), len(xy))


def _ints(parts: list[Index]) -> Index:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _pairs(triangles: Array, xy: Array) -> tuple[Index, Index]:
    """(triangle, point) pairs whose cells meet: each point against nearby triangles only."""
    low = xy.min(axis=0)
    extent = np.maximum(xy.max(axis=0) - low, 1e-9)
    cell = max(float(np.sqrt(extent[0] * extent[1] / len(xy))) * 2.0, float(extent.max()) / 512)
    shape = np.maximum(np.ceil(extent / cell).astype(np.int64), 1)
    where = np.minimum(((xy - low) / cell).astype(np.int64), shape - 1)
    ids = where[:, 0] + where[:, 1] * shape[0]
    order = np.argsort(ids, kind="stable")
    per_cell = np.bincount(ids, minlength=int(shape.prod()))
    first = np.concatenate(([0], np.cumsum(per_cell)))
    lo = np.floor((triangles[:, :, :2].min(axis=1) - low) / cell).astype(np.int64)
    hi = np.floor((triangles[:, :, :2].max(axis=1) - low) / cell).astype(np.int64)
    seen = np.all((hi >= 0) & (lo < shape), axis=1)
    lo, hi = np.clip(lo, 0, shape - 1), np.clip(hi, 0, shape - 1)
    wide = np.where(seen, hi[:, 0] - lo[:, 0] + 1, 0)
    tall = np.where(seen, hi[:, 1] - lo[:, 1] + 1, 0)
    tri = np.repeat(np.arange(len(triangles)), wide * tall)
    local = np.arange(len(tri)) - np.repeat(np.cumsum(wide * tall) - wide * tall, wide * tall)
    cells = lo[tri, 0] + local % wide[tri] + (lo[tri, 1] + local // wide[tri]) * shape[0]
    many = per_cell[cells]
    if int(many.sum()) > MAX_PAIRS:
        raise TooComplex(f"{len(triangles)} triangles: too costly to measure")
    tri, cells = np.repeat(tri, many), np.repeat(cells, many)
    offset = np.arange(len(tri)) - np.repeat(np.cumsum(many) - many, many)
    return tri, order[first[cells] + offset]


def _crossing(triangles: Array, points: Array) -> tuple[Array, npt.NDArray[np.bool_]]:
    """Height of each triangle's plane over its point, and whether the point is under it."""
    a, b, c = triangles[:, 0], triangles[:, 1], triangles[:, 2]
    e1, e2, d = b[:, :2] - a[:, :2], c[:, :2] - a[:, :2], points - a[:, :2]
    det = e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0]
    u = (d[:, 0] * e2[:, 1] - d[:, 1] * e2[:, 0]) / det
    v = (e1[:, 0] * d[:, 1] - e1[:, 1] * d[:, 0]) / det
    eps = 1e-12
    hit = (u >= -eps) & (v >= -eps) & (u + v <= 1 + eps)
    z = a[:, 2] + u * (b[:, 2] - a[:, 2]) + v * (c[:, 2] - a[:, 2])
    return z, hit


def _grouped(heights: Array, owners: Index, count: int) -> Columns:
    order = np.lexsort((heights, owners))
    heights, owners = heights[order], owners[order]
    same = np.zeros(len(heights), dtype=bool)
    same[1:] = (owners[1:] == owners[:-1]) & (np.diff(heights) <= _SAME)
    heights, owners = heights[~same], owners[~same]
    start = np.concatenate(([0], np.cumsum(np.bincount(owners, minlength=count))))
    return Columns(heights, start.astype(np.int64))
