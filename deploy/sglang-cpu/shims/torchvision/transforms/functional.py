"""TEST-ENVIRONMENT SHIM: only ``InterpolationMode`` is real; the rest raises when called."""

from enum import Enum

from torchvision._unavailable import module_getattr


class InterpolationMode(Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


__getattr__ = module_getattr(__name__)
