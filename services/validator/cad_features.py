"""Each feature of a part checked over its whole extent, not at a few probe points.

Two kinds of measurement, both on the candidate's mesh:

- **Columns** (vertical lines, :mod:`cad_columns`) cover a feature densely in x and y and
  see all of z at once: every column inside a bore (shrunk by the tolerance) must meet no
  material, every column in a wall, a tooth or the ring round a hole must be solid from
  the bottom to the top and nothing more.  A band, a pad or a pocket anywhere along the
  depth or the length shows.
- **Horizontal rays** at many heights and positions give the numbers the details report:
  a bore's diameter and centre, a tooth's width, a wall's thickness, as min-max.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from services.validator import cad_geometry as geo
from services.validator.cad_columns import Array, columns

Mask = npt.NDArray[np.bool_]

if TYPE_CHECKING:
    import trimesh

#: Heights a bore or a tooth is measured at (spread over its depth).
HEIGHTS: Final = 7
#: Directions a bore's radius is measured in, at each height.
_DIRECTIONS: Final = 12
#: Along a wall, about one column per this many mm (and at most ``_ALONG_MAX``).
_WALL_STEP: Final = 1.0
_ALONG_MAX: Final = 400


@dataclass(frozen=True, slots=True)
class Extent:
    """One feature's verdict over its extent: ok, and the measured range for the details."""

    ok: bool
    message: str


def heights(low: float, high: float, count: int = HEIGHTS) -> Array:
    return np.asarray(low + (np.arange(count) + 0.5) * (high - low) / count)


def _bad(flags: Mask, what: str) -> list[str]:
    wrong = int(np.count_nonzero(~flags))
    return [f"{what} at {wrong} of {len(flags)} columns"] if wrong else []


def bore(
    mesh: trimesh.Trimesh, centre: tuple[float, float, float], depth: float, tolerance: float
) -> Extent:
    """A round through-hole along z of diameter ``centre[2]``, from z = 0 to ``depth``."""
    x, y, diameter = centre
    radius = diameter / 2
    directions = geo.circle_directions(_DIRECTIONS, phase=0.1)
    zs = heights(0.0, depth)
    origins = np.repeat(
        np.column_stack([np.full(len(zs), x), np.full(len(zs), y), zs]), _DIRECTIONS, 0
    )
    reach = geo.first_hits(mesh, origins, np.tile(directions, (len(zs), 1))).reshape(len(zs), -1)
    reach = np.where(np.isfinite(reach), reach, 0.0)  # nothing met: no bore wall there
    diameters = 2 * reach.mean(axis=1)
    # The first harmonic of the radii around a point off the centre is the offset.
    offset_x = 2 * (reach * directions[:, 0]).mean(axis=1)
    offset_y = 2 * (reach * directions[:, 1]).mean(axis=1)
    off = float(np.max(np.hypot(offset_x, offset_y)))
    inner = _disc_points(x, y, max(radius - tolerance, 0.0))
    ring = _circle_points(x, y, radius + tolerance, 48)
    found = columns(mesh, np.concatenate([inner, ring]))
    clear, solid = (
        found.empty()[: len(inner)],
        found.solid_between(0.0, depth, tolerance)[len(inner) :],
    )
    wrong = _bad(clear, "material inside the bore") + _bad(solid, "no solid wall round it")
    low, high = float(np.min(diameters)), float(np.max(diameters))
    sized = abs(low - diameter) <= tolerance and abs(high - diameter) <= tolerance
    centred = off <= tolerance
    message = (
        f"diameter {low:.2f}-{high:.2f} mm over its depth, expected {diameter:.2f} "
        f"+- {tolerance:g}; centre off by up to {off:.2f} mm"
    )
    return Extent(sized and centred and not wrong, "; ".join([message, *wrong]))


def _circle_points(x: float, y: float, radius: float, count: int) -> Array:
    return np.asarray(np.array([x, y]) + radius * geo.circle_directions(count, 0.05)[:, :2])


def _disc_points(x: float, y: float, radius: float) -> Array:
    rings = [np.array([[x, y]])]
    for share in (0.35, 0.7, 1.0):
        rings.append(_circle_points(x, y, radius * share, max(8, int(24 * share))))
    return np.concatenate(rings)


def _turn(points: Array, angle: float) -> Array:
    c, s = np.cos(angle), np.sin(angle)
    return np.column_stack(
        [c * points[:, 0] - s * points[:, 1], s * points[:, 0] + c * points[:, 1]]
    )


@dataclass(frozen=True)
class Gear:
    teeth: int
    root: float  # radius
    tip: float  # radius along a tooth's axis
    width: float
    thickness: float
    tolerance: float

    def axis(self, k: int) -> float:
        return 2 * np.pi * k / self.teeth

    def tooth_widths(self, mesh: trimesh.Trimesh) -> Array:
        """Each tooth's width at three radii and three heights: rays from its axis out to
        both sides (from outside, a ray could start inside the next tooth)."""
        origins, directions = [], []
        for k in range(self.teeth):
            side = _turn(np.array([[0.0, 1.0]]), self.axis(k))[0]
            for r in np.linspace(self.root, self.tip, 5)[1:-1]:
                centre = _turn(np.array([[r, 0.0]]), self.axis(k))[0]
                for z in heights(0.0, self.thickness, 3):
                    origins += [[*centre, z], [*centre, z]]
                    directions += [[*side, 0.0], [*(-side), 0.0]]
        reach = geo.first_hits(mesh, np.array(origins), np.array(directions))
        widths = reach[0::2] + reach[1::2]
        return np.asarray(np.where(np.isfinite(widths), widths, 0.0))

    def tooth_columns(self, mesh: trimesh.Trimesh) -> tuple[Mask, Mask]:
        """Columns inside each tooth's outline (shrunk) and in the gaps beside it (grown)."""
        t = self.tolerance
        along = np.linspace(self.root + t, self.tip - t, 6)
        across_in = np.linspace(-self.width / 2 + t, self.width / 2 - t, 3)
        inside = np.array([[a, b] for a in along for b in across_in])
        beside = np.array([[a, s * (self.width / 2 + t)] for a in along for s in (-1, 1)])
        tip = np.array([[self.tip + t, 0.0]])
        turned = [
            (_turn(inside, self.axis(k)), _turn(np.concatenate([beside, tip]), self.axis(k)))
            for k in range(self.teeth)
        ]
        solid = np.concatenate([a for a, _ in turned])
        empty = np.concatenate([b for _, b in turned])
        found = columns(mesh, np.concatenate([solid, empty]))
        return (
            found.solid_between(0.0, self.thickness, t)[: len(solid)],
            found.empty()[len(solid) :],
        )

    def roots(self, mesh: trimesh.Trimesh) -> Array:
        """The disc's radius in the middle of each gap, at three heights (rays inward)."""
        origins, directions = [], []
        for k in range(self.teeth):
            middle = self.axis(k) + np.pi / self.teeth
            way = np.array([np.cos(middle), np.sin(middle)])
            for z in heights(0.0, self.thickness, 3):
                origins.append([*(way * (self.tip + 5.0)), z])
                directions.append([*(-way), 0.0])
        reach = geo.first_hits(mesh, np.array(origins), np.array(directions))
        return np.asarray(self.tip + 5.0 - reach)

    def root_columns(self, mesh: trimesh.Trimesh) -> tuple[Mask, Mask]:
        """Solid just inside the root circle all round; empty just outside it in the gaps."""
        t = self.tolerance
        disc = _circle_points(0.0, 0.0, self.root - t, max(90, 4 * self.teeth))
        half_gap = np.pi / self.teeth - np.arcsin(min(1.0, (self.width / 2 + t) / self.root))
        gaps = []
        for k in range(self.teeth):
            middle = self.axis(k) + np.pi / self.teeth
            for angle in np.linspace(middle - 0.8 * half_gap, middle + 0.8 * half_gap, 3):
                gaps.append([(self.root + t) * np.cos(angle), (self.root + t) * np.sin(angle)])
        found = columns(mesh, np.concatenate([disc, np.array(gaps)]))
        return (
            found.solid_between(0.0, self.thickness, t)[: len(disc)],
            found.empty()[len(disc) :],
        )


def teeth_extent(mesh: trimesh.Trimesh, gear: Gear) -> Extent:
    widths = gear.tooth_widths(mesh)
    solid, empty = gear.tooth_columns(mesh)
    wrong = _bad(solid, "teeth not solid") + _bad(empty, "material beside or past the teeth")
    low, high = float(widths.min()), float(widths.max())
    sized = abs(low - gear.width) <= gear.tolerance and abs(high - gear.width) <= gear.tolerance
    message = f"tooth width {low:.2f}-{high:.2f} mm, expected {gear.width:g} +- {gear.tolerance:g}"
    return Extent(sized and not wrong, "; ".join([message, *wrong]))


def root_extent(mesh: trimesh.Trimesh, gear: Gear) -> Extent:
    radii = gear.roots(mesh)
    solid, empty = gear.root_columns(mesh)
    wrong = _bad(solid, "disc not solid inside the root circle") + _bad(
        empty, "material in the gaps"
    )
    low, high = 2 * float(radii.min()), 2 * float(radii.max())
    expected, t = 2 * gear.root, gear.tolerance
    sized = abs(low - expected) <= t and abs(high - expected) <= t
    message = f"root diameter {low:.2f}-{high:.2f} mm, expected {expected:g} +- {t:g}"
    return Extent(sized and not wrong, "; ".join([message, *wrong]))


@dataclass(frozen=True)
class Box:
    size: tuple[float, float, float]
    wall: float
    tolerance: float

    def _perimeter(self, inset: float) -> Array:
        """Points at ``inset`` mm inside the outer faces, all round (corners left out)."""
        x, y, _ = self.size
        found: list[tuple[float, float]] = []
        for length, place in (
            (x, lambda s: (s, inset)),
            (x, lambda s: (s, y - inset)),
            (y, lambda s: (inset, s)),
            (y, lambda s: (x - inset, s)),
        ):
            count = int(min(_ALONG_MAX, max(8, length / _WALL_STEP)))
            spots = np.linspace(
                self.wall + self.tolerance, length - self.wall - self.tolerance, count
            )
            found.extend(place(float(s)) for s in spots)
        return np.array(found, dtype=np.float64)

    def walls(self, mesh: trimesh.Trimesh) -> Extent:
        t, z = self.tolerance, self.size[2]
        solid = np.concatenate([self._perimeter(t), self._perimeter(self.wall - t)])
        cavity = self._perimeter(self.wall + t)
        outside = self._perimeter(-t)
        found = columns(mesh, np.concatenate([solid, cavity, outside]))
        n, m = len(solid), len(solid) + len(cavity)
        wrong = (
            _bad(found.solid_between(0.0, z, t)[:n], "wall not solid over its height")
            + _bad(found.solid_between(0.0, self.wall, t)[n:m], "material inside the wall")
            + _bad(found.empty()[m:], "material outside the wall")
        )
        low, high = self.thicknesses(mesh)
        sized = abs(low - self.wall) <= t and abs(high - self.wall) <= t
        message = f"wall thickness {low:.2f}-{high:.2f} mm, expected {self.wall:g} +- {t:g}"
        return Extent(sized and not wrong, "; ".join([message, *wrong]))

    def thicknesses(self, mesh: trimesh.Trimesh) -> tuple[float, float]:
        """Thickness of the four walls by rays from outside, on a grid over each."""
        x, y, z = self.size
        origins, directions = [], []
        for s in np.linspace(0.15, 0.85, 6):
            for h in heights(self.wall, z, 4):
                origins += [[-5, s * y, h], [x + 5, s * y, h], [s * x, -5, h], [s * x, y + 5, h]]
                directions += [[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0]]
        hits = geo.ray_hits(mesh, np.array(origins, float), np.array(directions, float))
        found = np.array([h[1] - h[0] if len(h) >= 2 else 0.0 for h in hits])
        return float(found.min()), float(found.max())

    def floor(self, mesh: trimesh.Trimesh) -> tuple[Extent, Extent]:
        """The floor's thickness over a grid of the cavity, and nothing above it."""
        x, y, _ = self.size
        t, inset = self.tolerance, self.wall + self.tolerance
        xs = np.linspace(inset, x - inset, int(min(40, max(4, x / 2))))
        ys = np.linspace(inset, y - inset, int(min(40, max(4, y / 2))))
        found = columns(mesh, np.array([[a, b] for a in xs for b in ys]))
        counts = found.counts()
        firsts = np.array([found.of(i)[0] if counts[i] else np.nan for i in range(len(counts))])
        seconds = np.array(
            [found.of(i)[1] if counts[i] > 1 else np.nan for i in range(len(counts))]
        )
        thick = seconds - firsts
        low, high = float(np.nanmin(thick, initial=np.inf)), float(np.nanmax(thick, initial=0.0))
        ok = bool(np.all(np.abs(thick - self.wall) <= t) and np.all(np.abs(firsts) <= t))
        floor = Extent(
            ok, f"floor thickness {low:.2f}-{high:.2f} mm, expected {self.wall:g} +- {t:g}"
        )
        owner = np.repeat(np.arange(len(counts)), counts)
        high_up = np.unique(owner[found.heights > self.wall + t]).size
        lid = Extent(
            high_up == 0,
            f"material above the floor (z > {self.wall + t:g}) at {high_up} of {len(counts)} "
            "columns",
        )
        return floor, lid
