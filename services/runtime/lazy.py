"""Package names that load on first use (PEP 562).

A package's ``__init__`` that imports its heavy modules makes every import of one light
submodule (settings, errors) pay for all of them, in every process that starts: each CLI
command and each service.  Such a package lists its names here instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``names[name]`` (a module) when ``name`` is
    first read from ``package``."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
