"""The control service: the stack's view of itself, for ``temper status`` and any client."""

from services.control.service import ControlService, ControlSettings

__all__ = ["ControlService", "ControlSettings"]
