"""Placeholders of the sgl_kernel test shim: importable, and raise loudly when called."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn


class ShimKernelCalled(RuntimeError):
    """A kernel of the stand-in sgl_kernel was called: this path needs the real package."""


def placeholder(qualname: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> NoReturn:
        raise ShimKernelCalled(
            f"{qualname} was called, but sgl_kernel here is the Temper test shim "
            "(deploy/sglang-cpu/shims): this code path needs the real sgl_kernel"
        )

    kernel.__name__ = qualname.rsplit(".", 1)[-1]
    kernel.__qualname__ = qualname
    return kernel


def define(namespace: dict[str, Any], module: str, names: Iterable[str]) -> None:
    for name in names:
        namespace[name] = placeholder(f"{module}.{name}")
