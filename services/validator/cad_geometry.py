"""Measurements on a triangle mesh: ray casts, bodies, through-holes.

Vertical rays in bulk are :mod:`cad_columns`; this module casts rays in any direction.

Pure numpy on top of a loaded :class:`trimesh.Trimesh`: trimesh's own ray casting
needs rtree (or embree), and its connected components scipy or networkx; a part
of a few thousand triangles needs neither.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import trimesh

Array = npt.NDArray[np.float64]
#: Rays cast against all triangles at once, at most this many per batch (memory bound).
_BATCH: Final = 64
#: Hits closer than this along one ray are one hit (a ray through a shared edge meets both).
_SAME_HIT: Final = 1e-6


class MeshError(ValueError):
    """The STL cannot be read as a triangle mesh."""


def load_stl(data: bytes) -> trimesh.Trimesh:
    """The mesh of an STL (ASCII or binary), its duplicate vertices merged."""
    # Imported here: it takes most of a second, which a validator without cad domains
    # (and every CLI command that builds validators) should not pay.
    import trimesh

    try:
        mesh = trimesh.load(io.BytesIO(data), file_type="stl", process=True)
    except Exception as error:  # trimesh raises assorted types on malformed files
        raise MeshError(f"unreadable STL: {type(error).__name__}: {error}") from None
    if not isinstance(mesh, trimesh.Trimesh) or len(mesh.faces) == 0:
        raise MeshError("the STL holds no triangles")
    return mesh


def ray_hits(mesh: trimesh.Trimesh, origins: Array, directions: Array) -> list[Array]:
    """Per ray, the sorted distances at which it crosses the surface (Moller-Trumbore)."""
    triangles = np.asarray(mesh.triangles, dtype=np.float64)
    directions = np.broadcast_to(directions, origins.shape)
    found: list[Array] = []
    for start in range(0, len(origins), _BATCH):
        batch = slice(start, start + _BATCH)
        found.extend(_hits_batch(triangles, origins[batch], directions[batch]))
    return found


def _hits_batch(triangles: Array, origins: Array, directions: Array) -> list[Array]:
    a, b, c = triangles[:, 0], triangles[:, 1], triangles[:, 2]
    edge1, edge2 = b - a, c - a
    # Every ray against every triangle: shapes (rays, triangles, 3).
    p = np.cross(directions[:, None, :], edge2[None, :, :])
    det = np.einsum("rtk,tk->rt", p, edge1)
    ok = np.abs(det) > 1e-12
    inv = np.where(ok, 1.0 / np.where(ok, det, 1.0), 0.0)
    s = origins[:, None, :] - a[None, :, :]
    u = np.einsum("rtk,rtk->rt", s, p) * inv
    q = np.cross(s, edge1[None, :, :])
    v = np.einsum("rk,rtk->rt", directions, q) * inv
    t = np.einsum("tk,rtk->rt", edge2, q) * inv
    eps = 1e-9
    inside = ok & (u >= -eps) & (v >= -eps) & (u + v <= 1 + eps) & (t > eps)
    return [_distinct(t[row][inside[row]]) for row in range(len(origins))]


def _distinct(distances: Array) -> Array:
    ordered = np.sort(distances)
    if len(ordered) < 2:
        return ordered
    keep = np.concatenate(([True], np.diff(ordered) > _SAME_HIT))
    return ordered[keep]


def body_count(mesh: trimesh.Trimesh) -> int:
    """Connected pieces of the mesh (vertices joined by edges), by union-find."""
    parent = list(range(len(mesh.vertices)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in np.asarray(mesh.edges_unique).tolist():
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[ra] = rb
    used = np.unique(np.asarray(mesh.faces).ravel()).tolist()
    return len({root(i) for i in used})


def through_holes(mesh: trimesh.Trimesh, bodies: int) -> int:
    """Genus summed over the bodies of a closed mesh: Euler number = 2 x bodies - 2 x genus."""
    return (2 * bodies - int(mesh.euler_number)) // 2


def first_hits(mesh: trimesh.Trimesh, origins: Array, directions: Array) -> Array:
    """Distance to the first surface along each ray (inf where it meets none)."""
    hits = ray_hits(mesh, origins, directions)
    return np.array([h[0] if len(h) else np.inf for h in hits])


def circle_directions(count: int, phase: float = 0.0) -> Array:
    angles = phase + np.arange(count) * 2 * np.pi / count
    return np.column_stack([np.cos(angles), np.sin(angles), np.zeros(count)])


def runs_around(flags: npt.NDArray[np.bool_]) -> int:
    """Runs of True in a circular sequence (teeth met on a circle of samples)."""
    if flags.all():
        return 0
    starts = flags & ~np.roll(flags, 1)
    return int(starts.sum())


def max_radius(mesh: trimesh.Trimesh) -> float:
    """The largest distance of a vertex from the z axis."""
    vertices = np.asarray(mesh.vertices)
    return float(np.hypot(vertices[:, 0], vertices[:, 1]).max())
