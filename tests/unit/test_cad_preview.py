"""The CAD validator's PNG preview: what it draws, and which rollouts get one."""

from __future__ import annotations

import asyncio
import io
import struct

import numpy as np
import pytest
import trimesh

from protocol.messages import Rollout, SandboxLimits, SandboxResult, SandboxStatus
from services import registry
from services.domains.api import Split
from services.domains.cad import domain
from services.validator.base import Verdict
from services.validator.cad import CadPart
from services.validator.cad_preview import BACKGROUND, SIZE_PX, render_preview
from services.validator.settings import PreviewMode, ValidatorSettings
from tests.unit import cad_meshes
from tests.unit.test_cad_parts import FakeSandbox

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which a PNG must open with."""
    assert png.startswith(PNG_SIGNATURE), png[:16]
    assert png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def drawn_share(png: bytes) -> float:
    """Share of pixels that are not the background colour."""
    import matplotlib.colors
    import matplotlib.image

    pixels = matplotlib.image.imread(io.BytesIO(png), format="png")[:, :, :3]
    background = np.array(matplotlib.colors.to_rgb(BACKGROUND))
    return float(np.mean(np.any(np.abs(pixels - background) > 0.02, axis=2)))


def assert_a_picture(png: bytes | None) -> None:
    """A PNG of the expected size with a part drawn on it, not a blank canvas."""
    assert png is not None
    assert png_size(png) == (SIZE_PX, SIZE_PX)
    assert drawn_share(png) > 0.05
    # Small enough to ride in a scored rollout many times over under NATS's 1 MiB.
    assert len(png) < 64 * 1024


def test_a_gear_preview_is_a_small_drawn_png_and_the_same_every_time() -> None:
    gear = cad_meshes.gear(12, 20, 5, 4, 6, 8)
    png = render_preview(gear)
    assert_a_picture(png)
    assert render_preview(gear) == png


def test_a_part_far_from_the_origin_is_still_in_the_picture() -> None:
    box = cad_meshes.open_box(40, 30, 20, 2)
    box.apply_translation([500.0, -300.0, 80.0])
    assert_a_picture(render_preview(box))


def score(mode: PreviewMode, split: Split) -> Verdict:
    stl = trimesh.creation.box([1, 1, 1]).export(file_type="stl")
    result = SandboxResult(id="x", status=SandboxStatus.OK, outputs={"out.stl": stl})
    example = domain("cad-box", {"shape": "box"}).examples(1, split)[0]
    text = "```openscad\ncube(1);\n```"
    rollout = Rollout(id="r/0", task=example.task, sample_index=0, completion_text=text)
    validator = CadPart(
        FakeSandbox(result),
        SandboxLimits(timeout_s=3.0),
        grace_s=1.0,
        default_timeout_s=5.0,
        previews=mode,
    )
    return asyncio.run(validator.score(rollout))


def test_held_out_parts_get_a_preview_by_default_and_training_parts_do_not() -> None:
    assert_a_picture(score("heldout", "eval").preview)
    assert score("heldout", "train").preview is None


def test_all_previews_every_part_and_off_none() -> None:
    assert_a_picture(score("all", "train").preview)
    off = score("off", "eval")
    assert off.preview is None
    assert 0 < off.score < 1  # still judged, only not drawn


def test_the_preview_setting_comes_from_the_environment_and_a_typo_fails_at_start() -> None:
    assert ValidatorSettings().cad_previews == "heldout"
    built = registry.build("validator", {"TEMPER_VALIDATOR_CAD_PREVIEWS": "off"})
    assert built.settings.cad_previews == "off"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="CAD_PREVIEWS='none': expected one of heldout, all"):
        ValidatorSettings(cad_previews="none")
