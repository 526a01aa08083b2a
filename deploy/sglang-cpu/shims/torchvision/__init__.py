"""TEST-ENVIRONMENT SHIM standing in for torchvision; see ``_unavailable`` and the README."""

from torchvision import io, transforms
from torchvision._unavailable import module_getattr

__version__ = "0.0.0+temper.shim"
__all__ = ["io", "transforms"]
__getattr__ = module_getattr(__name__)
