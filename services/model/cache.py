"""Model directories built once per recipe and kept outside any clone.

A warmed policy takes minutes on two cores; the tests and benchmarks that need one find
it under ``$TEMPER_CACHE`` (default /var/cache/temper), named by a hash of everything that
decides its bytes: the recipe's own parts, the source files that build it and the torch
and transformers versions.  A new machine builds it again; a second run reuses it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

#: The services package: domain code under it is part of the recipes that warm up on it.
MODEL_ROOT = Path(__file__).resolve().parents[1]
#: The files that decide a built model's bytes (initialisation, tokenizer, loading, the
#: warm-up and its greedy probe): part of every recipe.  Not the cache or the weight files,
#: so a change there keeps every cached model.  A unit test checks that what these import
#: from services.model is among them.
BUILDERS: tuple[Path, ...] = tuple(
    MODEL_ROOT / "model" / name
    for name in ("tiny.py", "tokens.py", "load.py", "sft.py", "greedy.py")
)


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

    One build per name at a time (a lock beside it): a second process that needs the same
    model waits for the first one's instead of spending the same minutes again.  Built
    beside its final name and renamed into place: a run killed half-way leaves no
    half-built model under that name.
    """
    path = cache_root() / f"{name}-{key}"
    if (path / "config.json").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f".{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / "config.json").exists():
            _build_into(path, build)
    return path


def _build_into(path: Path, build: Callable[[Path], None]) -> None:
    building = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    try:
        build(building / "model")
        shutil.rmtree(path, ignore_errors=True)  # without config.json it is no model
        (building / "model").rename(path)
    finally:
        shutil.rmtree(building, ignore_errors=True)
