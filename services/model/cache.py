"""Model directories built once per recipe and kept outside any clone.

A warmed policy takes minutes on two cores; the tests and benchmarks that need one find
it under ``$TEMPER_CACHE`` (default /var/cache/temper), named by a hash of everything that
decides its bytes: the recipe's own parts, the source files that build it and the torch
and transformers versions.  A new machine builds it again; a second run reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

#: Where the model code lives: its files are part of every recipe that names them.
MODEL_ROOT = Path(__file__).resolve().parents[1]


def cache_root() -> Path:
    root = Path(os.environ.get("TEMPER_CACHE") or "/var/cache/temper")
    return root if os.access(root, os.W_OK) else Path(tempfile.gettempdir())


def recipe_key(parts: Iterable[object], sources: Iterable[Path] = ()) -> str:
    """16 hex digits over the parts (as JSON) and the named source files' bytes."""
    import torch
    import transformers

    digest = hashlib.sha256(
        json.dumps([*parts, torch.__version__, transformers.__version__], default=repr).encode()
    )
    for source in sorted(sources):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def cached_model(name: str, key: str, build: Callable[[Path], None]) -> Path:
    """The directory ``<cache>/<name>-<key>``, built by ``build(path)`` if it is missing.

    Built beside its final name and renamed into place: a run killed half-way leaves no
    half-built model under that name, and two runs building at once both end with one.
    """
    path = cache_root() / f"{name}-{key}"
    if (path / "config.json").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    try:
        build(building / "model")
        try:
            (building / "model").rename(path)
        except OSError:  # another run got there first
            if not (path / "config.json").exists():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return path
