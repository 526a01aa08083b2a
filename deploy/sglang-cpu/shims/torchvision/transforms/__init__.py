"""TEST-ENVIRONMENT SHIM: ``InterpolationMode`` is real (used in default arguments at import)."""

from torchvision._unavailable import module_getattr
from torchvision.transforms import functional, v2
from torchvision.transforms.functional import InterpolationMode

__all__ = ["InterpolationMode", "functional", "v2"]
__getattr__ = module_getattr(__name__)
