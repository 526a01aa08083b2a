"""Digests of weight directories: a PolicyUpdate names one, the generator checks it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

WEIGHT_PATTERNS = ("*.safetensors",)
_CHUNK = 1 << 20


class DigestMismatch(ValueError):
    def __init__(self, path: Path, expected: str, found: str) -> None:
        super().__init__(f"weights at {path} have digest {found}, the update says {expected}")
        self.path = path
        self.expected = expected
        self.found = found


def weight_files(path: Path) -> list[Path]:
    files = sorted({f for pattern in WEIGHT_PATTERNS for f in path.glob(pattern)})
    if not files:
        raise FileNotFoundError(f"no weight files ({', '.join(WEIGHT_PATTERNS)}) in {path}")
    return files


def directory_digest(path: Path) -> str:
    """``sha256:<hex>`` over the names and bytes of the directory's weight files, in name order."""
    digest = hashlib.sha256()
    for file in weight_files(path):
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def bytes_digest(files: Iterable[tuple[str, bytes]]) -> str:
    """:func:`directory_digest` of files held in memory as ``(name, bytes)``, in name order."""
    digest = hashlib.sha256()
    for name, data in sorted(files, key=lambda item: item[0]):
        digest.update(name.encode() + b"\0")
        digest.update(data)
    return f"sha256:{digest.hexdigest()}"


def verify_digest(path: Path, expected: str) -> None:
    found = directory_digest(path)
    if found != expected:
        raise DigestMismatch(path, expected, found)
