"""A small PNG of a rendered part, for people reading evaluation reports.

The mesh is turned to a fixed isometric-ish view, its faces drawn back to front (a
painter's sort is exact enough for a picture and needs no 3D toolkit) and shaded by
their angle to one light.  matplotlib's Agg canvas draws it: no display, no network,
and the same bytes for the same mesh.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Final

import numpy as np

from services.validator.cad_geometry import Array

if TYPE_CHECKING:
    import trimesh

#: Pixels per side of the square PNG.
SIZE_PX: Final = 256
BACKGROUND: Final = "#ffffff"
#: Colour of a face turned straight to the light; others are darker, never black.
_BASE: Final = np.array([0.33, 0.55, 0.80])
_AMBIENT: Final = 0.35
#: From above, front and slightly left: tops, front faces and bore walls all read apart.
_LIGHT: Final = np.array([-0.3, -0.5, 0.8]) / np.linalg.norm([-0.3, -0.5, 0.8])
_DPI: Final = 100


def _view() -> Array:
    """Rotation to the view: 45 degrees about z, then tilted 35 degrees towards the viewer."""
    yaw, pitch = np.radians(-45.0), np.radians(-55.0)
    about_z = np.array(
        [[np.cos(yaw), -np.sin(yaw), 0.0], [np.sin(yaw), np.cos(yaw), 0.0], [0.0, 0.0, 1.0]]
    )
    about_x = np.array(
        [[1.0, 0.0, 0.0], [0.0, np.cos(pitch), -np.sin(pitch)], [0.0, np.sin(pitch), np.cos(pitch)]]
    )
    rotation: Array = about_x @ about_z
    return rotation


def _shaded(triangles: Array) -> tuple[Array, Array]:
    """Projected 2D triangles, back to front, and their RGB colours."""
    view = triangles @ _view().T
    normals = np.cross(view[:, 1] - view[:, 0], view[:, 2] - view[:, 0])
    lengths = np.linalg.norm(normals, axis=1, keepdims=True)
    normals = normals / np.where(lengths > 0, lengths, 1.0)
    # Faces seen from behind (inside walls) are lit as if turned round.
    light = np.abs(normals @ (_view() @ _LIGHT))
    colours = _BASE[None, :] * (_AMBIENT + (1 - _AMBIENT) * light[:, None])
    order = np.argsort(view[:, :, 2].mean(axis=1), kind="stable")  # far (low z) first
    return view[order][:, :, :2], colours[order]


def render_preview(mesh: trimesh.Trimesh) -> bytes:
    """The part as a ``SIZE_PX`` square PNG (CPU work: run it off the event loop)."""
    # Imported here, as trimesh is: a validator without cad domains never pays for it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure

    polygons, colours = _shaded(np.asarray(mesh.triangles, dtype=np.float64))
    figure = Figure(figsize=(SIZE_PX / _DPI, SIZE_PX / _DPI), dpi=_DPI, facecolor=BACKGROUND)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0.02, 0.02, 0.96, 0.96))
    # Edges in the face colour close the hairline gaps antialiasing leaves between faces.
    axes.add_collection(PolyCollection(list(polygons), facecolors=colours, edgecolors=colours))
    axes.autoscale_view()
    axes.set_aspect("equal", adjustable="datalim")
    axes.set_axis_off()
    out = io.BytesIO()
    # No "Software" entry: the bytes stay the same across matplotlib versions' names.
    figure.savefig(out, format="png", dpi=_DPI, metadata={"Software": None})
    return out.getvalue()
