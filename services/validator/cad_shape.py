"""The candidate's whole shape against the reference solid's: volume overlap and surface
distance, as CadEval compares CAD models.

- **Volume IoU**: a grid of points over both parts' bounds, each tested for containment in
  the reference (exactly) and in the candidate (vertical columns, :mod:`cad_columns`).
- **Surface distance**: points sampled uniformly on both surfaces; each candidate point's
  distance to the reference surface (exact), each reference point's to the candidate's
  triangles (exact).  Chamfer is the mean of the two directions' means; the 95th
  percentile Hausdorff distance the larger of the two directions' 95th percentiles.

A part exact only where the feature checks look (a lump or a pocket elsewhere to keep the
volume, a shell of the right size) is far from the reference here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

from services.validator.cad_columns import Array, TooComplex, columns
from services.validator.cad_reference import Solid

if TYPE_CHECKING:
    import trimesh

#: Points sampled on each surface.
SURFACE_POINTS: Final = 1000
#: Columns of the volume grid (their heights are cheap: ``_LEVELS`` each).
_GRID_COLUMNS: Final = 6000
_LEVELS: Final = 48
#: Points sampled on the candidate to bound each distance before measuring it exactly.
_BOUND_POINTS: Final = 2500
#: Point-triangle pairs tried at most for the distances (the reference parts at $fn = 64
#: need at most about 150 000): past it a mesh is too costly to measure.
MAX_PAIRS: Final = 4_000_000
#: Point-triangle distances per batch (memory bound).
_BATCH: Final = 1_000_000


@dataclass(frozen=True)
class ShapeMatch:
    iou: float
    chamfer: float
    hausdorff95: float


def compare(mesh: trimesh.Trimesh, solid: Solid) -> ShapeMatch:
    """The candidate's mesh against the reference solid (CPU work: off the event loop)."""
    candidate = mesh_surface(mesh, SURFACE_POINTS)
    reference = solid.surface(SURFACE_POINTS)
    there = np.abs(solid.distance(candidate))
    back = distance_to_mesh(mesh, reference)
    chamfer = (float(there.mean()) + float(back.mean())) / 2
    hausdorff = max(float(np.percentile(there, 95)), float(np.percentile(back, 95)))
    return ShapeMatch(volume_iou(mesh, solid), chamfer, hausdorff)


def mesh_surface(mesh: trimesh.Trimesh, count: int, seed: int = 0) -> Array:
    """``count`` points uniform on the mesh's triangles (the same ones for the same mesh)."""
    rng = np.random.default_rng(seed)
    triangles = np.asarray(mesh.triangles, dtype=np.float64)
    areas = np.asarray(mesh.area_faces, dtype=np.float64)
    chosen = np.searchsorted(np.cumsum(areas), rng.random(count) * areas.sum())
    chosen = np.minimum(chosen, len(triangles) - 1)
    u, v = rng.random(count), rng.random(count)
    flip = u + v > 1
    u, v = np.where(flip, 1 - u, u), np.where(flip, 1 - v, v)
    a, b, c = (triangles[chosen, k] for k in range(3))
    return np.asarray(a + u[:, None] * (b - a) + v[:, None] * (c - a))


def distance_to_mesh(mesh: trimesh.Trimesh, points: Array) -> Array:
    """Each point's distance to the nearest triangle, exactly: the nearest of many points
    sampled on the mesh bounds it, then every triangle that could be nearer (by its
    bounding sphere, then its box) is measured."""
    from trimesh.triangles import closest_point

    triangles = np.asarray(mesh.triangles, dtype=np.float64)
    centres = triangles.mean(axis=1)
    radii = np.linalg.norm(triangles - centres[:, None, :], axis=2).max(axis=1)
    low, high = triangles.min(axis=1), triangles.max(axis=1)
    dense = mesh_surface(mesh, _BOUND_POINTS, seed=1)
    rows = max(1, _BATCH // max(len(triangles), len(dense)))
    found, tried = np.empty(len(points)), 0
    for begin in range(0, len(points), rows):
        batch = points[begin : begin + rows]
        best = np.sqrt(np.maximum(_squared(batch, dense).min(axis=1), 0.0)) + 1e-9
        reach = np.sqrt(np.maximum(_squared(batch, centres), 0.0)) - radii
        point, tri = np.nonzero(reach < best[:, None])
        tried += len(point)
        if tried > MAX_PAIRS:
            # Many large triangles crossing each other: no part needs them.
            raise TooComplex(f"{len(triangles)} triangles: too costly to measure")
        # The triangles' boxes bound tighter than their spheres (long thin triangles).
        where = batch[point]
        outside = np.maximum(np.maximum(low[tri] - where, where - high[tri]), 0.0)
        keep = (outside**2).sum(axis=1) < best[point] ** 2
        point, tri = point[keep], tri[keep]
        nearest = closest_point(triangles[tri], batch[point])  # type: ignore[no-untyped-call]
        gaps = np.linalg.norm(nearest - batch[point], axis=1)
        np.minimum.at(best, point, gaps)
        found[begin : begin + rows] = best
    return found


def _squared(a: Array, b: Array) -> Array:
    """Squared distances between every point of ``a`` and every point of ``b``."""
    return np.asarray((a**2).sum(axis=1)[:, None] + (b**2).sum(axis=1) - 2 * a @ b.T)


def volume_iou(mesh: trimesh.Trimesh, solid: Solid) -> float:
    """Share of the grid points inside both parts among those inside either."""
    bounds = np.asarray(mesh.bounds, dtype=np.float64)
    reach = solid.bounds()
    low, high = np.minimum(bounds[0], reach[0]), np.maximum(bounds[1], reach[1])
    extent = np.maximum(high - low, 1e-6)
    step = float(np.sqrt(extent[0] * extent[1] / _GRID_COLUMNS))
    nx, ny = (max(1, int(np.ceil(extent[k] / step))) for k in range(2))
    xs = low[0] + (np.arange(nx) + 0.5) * extent[0] / nx
    ys = low[1] + (np.arange(ny) + 0.5) * extent[1] / ny
    zs = low[2] + (np.arange(_LEVELS) + 0.5) * extent[2] / _LEVELS
    xy = np.column_stack([np.repeat(xs, ny), np.tile(ys, nx)])
    theirs = columns(mesh, xy).inside(zs)
    ours = solid.contains_grid(xy, zs)
    either = int(np.count_nonzero(theirs | ours))
    return float(np.count_nonzero(theirs & ours)) / either if either else 0.0
