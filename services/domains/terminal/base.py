"""What a terminal task template makes, and the check conditions the templates share.

A check is a bash condition (exit 0: passed) plus the message a failure reports.  The
helpers below build conditions that call ``python3`` with their values as arguments,
so no value (a file name, a line of a log) is ever spliced into shell code unquoted.
"""

from __future__ import annotations

import json
import random
import shlex
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Check:
    """One check of a hidden test: ``condition`` is bash; exit status 0 means it passed."""

    name: str
    message: str
    condition: str


@dataclass(frozen=True, kw_only=True)
class Made:
    """One task drawn from a template."""

    #: The drawn values that make this task distinct (part of its key).
    values: str
    #: What the policy is asked to do (the working directory is the session's).
    prompt: str
    #: The files the session starts with: relative path -> text.
    files: dict[str, str]
    checks: tuple[Check, ...]
    #: Shell commands that solve the task, each run as one bash tool call.
    solution: tuple[str, ...]


Template = Callable[[random.Random], Made]

_FILE_IS = (
    "import sys\n"
    "try:\n"
    "    text = open(sys.argv[1]).read()\n"
    "except OSError:\n"
    "    sys.exit(1)\n"
    "sys.exit(text.strip() != sys.argv[2])"
)
_LINES_ARE = (
    "import sys, json\n"
    "try:\n"
    "    text = open(sys.argv[1]).read()\n"
    "except OSError:\n"
    "    sys.exit(1)\n"
    "lines = [line.rstrip() for line in text.strip().splitlines()]\n"
    "sys.exit(lines != json.loads(sys.argv[2]))"
)
_JSON_IS = (
    "import sys, json\n"
    "try:\n"
    "    data = json.load(open(sys.argv[1]))\n"
    "except (OSError, ValueError):\n"
    "    sys.exit(1)\n"
    "sys.exit(data != json.loads(sys.argv[2]))"
)


def q(text: str) -> str:
    return shlex.quote(text)


def python(code: str, *args: str) -> str:
    """A condition running ``code`` with ``args`` as ``sys.argv[1:]``."""
    return " ".join(["python3", "-c", q(code), *map(q, args)])


def file_is(path: str, text: str) -> str:
    """The file holds ``text``, give or take surrounding whitespace."""
    return python(_FILE_IS, path, text)


def lines_are(path: str, lines: list[str]) -> str:
    """The file's lines are ``lines`` (trailing spaces and blank ends ignored)."""
    return python(_LINES_ARE, path, json.dumps(lines))


def json_is(path: str, value: object) -> str:
    """The file parses as JSON equal to ``value``."""
    return python(_JSON_IS, path, json.dumps(value))


def output_is(command: str, text: str) -> str:
    """``command`` (bash, run in the workdir) prints ``text``, give or take whitespace."""
    return python(
        "import subprocess, sys\n"
        "run = subprocess.run(['bash', '-c', sys.argv[1]], capture_output=True, text=True,"
        " timeout=20)\n"
        "sys.exit(run.returncode != 0 or run.stdout.strip() != sys.argv[2])",
        command,
        text,
    )


def word(rng: random.Random, words: tuple[str, ...]) -> str:
    return rng.choice(words)


NAMES: tuple[str, ...] = ("alpha", "bravo", "cedar", "delta", "ember", "fjord", "gamma")
NAMES += ("harbor", "indigo", "juniper", "kestrel", "lumen", "maple", "nimbus", "orchid")
NAMES += ("pylon", "quartz")
PEOPLE: tuple[str, ...] = ("ana", "ben", "chloe", "dev", "eli", "fay", "gus", "hana", "ivan")
PEOPLE += ("jade", "kai")


def only(*, name: str, message: str, condition: str) -> tuple[Check, ...]:
    """The checks of a task with one condition."""
    return (Check(name=name, message=message, condition=condition),)
