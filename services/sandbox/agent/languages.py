"""The language table: how code in each language is run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .common import is_str_list

PYTHON_FORK = "python-fork"
DEFAULT_LANGUAGES: dict[str, Any] = {
    "python": PYTHON_FORK,
    "bash": {"argv": ["bash", "{file}"], "suffix": ".sh"},
    "sh": {"argv": ["sh", "{file}"], "suffix": ".sh"},
    # Built next to the code file (the agent's scratch directory, emptied after the run).
    "c": {
        "argv": ["sh", "-c", 'gcc -O2 -o "$1.bin" "$1" -lm && exec "$1.bin"', "c", "{file}"],
        "suffix": ".c",
        "needs": "gcc",
    },
    "cpp": {
        "argv": ["sh", "-c", 'g++ -O2 -o "$1.bin" "$1" -lm && exec "$1.bin"', "cpp", "{file}"],
        "suffix": ".cc",
        "needs": "g++",
    },
    "js": {"argv": ["node", "{file}"], "suffix": ".js"},
    # Renders to out.stl in the workdir, which the caller fetches like any file it left
    # there (a session's snapshot); STL only: a PNG needs an X server the image lacks.
    "openscad": {
        "argv": ["openscad", "--export-format", "asciistl", "-o", "{workdir}/out.stl", "{file}"],
        "suffix": ".scad",
    },
}


@dataclass(frozen=True, slots=True)
class Language:
    name: str
    #: None for the python fork fast path, else the argv template.
    argv: tuple[str, ...] | None
    suffix: str = ""
    #: The program that must be installed (default: argv[0]); else an infra_error.
    needs: str | None = None


def parse_language(name: str, entry: Any) -> Language:
    if entry == PYTHON_FORK:
        return Language(name, None)
    if isinstance(entry, list):
        entry = {"argv": entry}
    if not isinstance(entry, dict):
        raise ValueError(f"language {name!r}: expected {PYTHON_FORK!r}, a list or an object")
    argv, suffix, needs = entry.get("argv"), entry.get("suffix", ""), entry.get("needs")
    if not is_str_list(argv) or not argv or not isinstance(suffix, str):
        raise ValueError(f"language {name!r}: argv must be a non-empty list of strings")
    if needs is not None and not isinstance(needs, str):
        raise ValueError(f"language {name!r}: needs must be a program name")
    return Language(name, tuple(argv), suffix, needs)


def parse_languages(override_json: str | None) -> dict[str, Language]:
    table = dict(DEFAULT_LANGUAGES)
    if override_json:
        override = json.loads(override_json)
        if not isinstance(override, dict):
            raise ValueError("--languages must be a JSON object")
        table.update(override)
    return {name: parse_language(name, e) for name, e in table.items() if e is not None}
