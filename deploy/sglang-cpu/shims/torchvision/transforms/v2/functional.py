"""TEST-ENVIRONMENT SHIM: placeholders that raise when called."""

from torchvision._unavailable import module_getattr
from torchvision.transforms.functional import InterpolationMode

__all__ = ["InterpolationMode"]
__getattr__ = module_getattr(__name__)
