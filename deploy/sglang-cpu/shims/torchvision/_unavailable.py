"""TEST-ENVIRONMENT SHIM (deploy/sglang-cpu/README.md): not the real torchvision.

PyPI's torchvision wheel is a CUDA build that fails to load next to the CPU torch of the
SGLang test venv.  SGLang imports torchvision at start-up only for multimodal models, so
this stand-in gives import what it needs and fails loudly if anything is ever used.
"""

from __future__ import annotations

from typing import Any, NoReturn


class Unavailable:
    """A placeholder: attribute access chains, any call raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Unavailable:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(
            f"{self._name} was called, but this torchvision is the Temper test shim "
            "(deploy/sglang-cpu/shims): multimodal preprocessing is not available here"
        )

    def __repr__(self) -> str:
        return f"<torchvision shim placeholder {self._name}>"


def module_getattr(module: str) -> Any:
    """A module-level ``__getattr__`` handing out placeholders for names it does not define."""

    def __getattr__(attr: str) -> Unavailable:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{module}.{attr}")

    return __getattr__
