"""TEST-ENVIRONMENT SHIM: placeholders that raise when called."""

from torchvision._unavailable import module_getattr
from torchvision.transforms.v2 import functional

__all__ = ["functional"]
__getattr__ = module_getattr(__name__)
