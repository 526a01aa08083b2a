"""Where a task's tool session runs, when not in the sandbox service's defaults.

Two ``Task.metadata`` keys, set by a domain whose tasks each need their own sandbox (the
``harbor`` kind: one image per task, limits from its task.toml):

* :data:`SANDBOX_IMAGE` (``sandbox_image``): the image the session runs
  (``SandboxOpen.image``: a Harbor task image);
* :data:`SANDBOX_LIMITS` (``sandbox_limits``): the session's limits, a map of
  ``SandboxLimits`` fields (``SandboxOpen.limits``).

The generator opens each trajectory's session with them; a validator that replays the
trajectory or checks its result reads them from its own domain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from protocol.messages import SandboxLimits

SANDBOX_IMAGE: Final = "sandbox_image"
SANDBOX_LIMITS: Final = "sandbox_limits"


@dataclass(frozen=True, kw_only=True)
class SandboxPlace:
    """A session's image (None: the service's own) and limits (None: its defaults)."""

    image: str | None = None
    limits: SandboxLimits | None = None

    def metadata(self) -> dict[str, Any]:
        """The metadata entries that say this place."""
        entries: dict[str, Any] = {}
        if self.image is not None:
            entries[SANDBOX_IMAGE] = self.image
        if self.limits is not None:
            entries[SANDBOX_LIMITS] = msgspec.to_builtins(self.limits)
        return entries


def place_of(metadata: Mapping[str, Any]) -> SandboxPlace | None:
    """The place ``metadata`` names, None when it names none; ValueError names a bad entry."""
    image, limits = metadata.get(SANDBOX_IMAGE), metadata.get(SANDBOX_LIMITS)
    if image is None and limits is None:
        return None
    if image is not None and (not isinstance(image, str) or not image):
        raise ValueError(f"task metadata[{SANDBOX_IMAGE!r}] must be an image name, not {image!r}")
    if limits is None:
        return SandboxPlace(image=image)
    try:
        converted = msgspec.convert(limits, SandboxLimits)
    except msgspec.ValidationError as error:
        raise ValueError(f"task metadata[{SANDBOX_LIMITS!r}]: {error}") from None
    return SandboxPlace(image=image, limits=converted)
