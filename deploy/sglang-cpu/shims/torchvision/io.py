"""TEST-ENVIRONMENT SHIM: every name here is a placeholder that raises when called."""

from torchvision._unavailable import module_getattr

__getattr__ = module_getattr(__name__)
