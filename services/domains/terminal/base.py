"""What a terminal task template makes, and the probes its checks are made of.

A check is a probe plus the message a failure reports.  A probe says what to observe in
the work directory the policy left (the exit status and output of a bash command, or a
file's text) and what that observation must equal.  Only the observation's recipe
(``run`` or ``read``) ever enters a sandbox; the expected value stays in the task's
metadata and is compared in the validator's own process, so nothing in the sandbox can
read it, and a command that prints "pass" proves nothing.
"""

from __future__ import annotations

import random
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

#: How an observation is compared with a probe's ``value`` (see services/validator/terminal_probes).
EXPECTS: Final = frozenset({"ok", "text", "lines", "json", "pairs", "lacks"})


@dataclass(frozen=True, kw_only=True)
class Probe:
    """``run``: a bash command run in the work directory (exit status and stdout), or
    ``read``: a file of it, read as it is (never through a symlink); then ``expect``
    names how the observation must match ``value``: ``ok`` (exit status 0), ``text``
    (equal, give or take surrounding whitespace), ``lines`` (the list of lines, trailing
    spaces and blank ends ignored), ``json`` (parses equal), ``pairs`` (``KEY=value``
    words, as a dict), ``lacks`` (does not contain ``value``).  A ``run`` must exit 0."""

    run: str | None = None
    read: str | None = None
    expect: str
    value: Any = None

    def __post_init__(self) -> None:
        if (self.run is None) == (self.read is None) or self.expect not in EXPECTS:
            raise ValueError(f"a probe runs or reads one thing and expects one of {EXPECTS}")

    def to_metadata(self) -> dict[str, Any]:
        source = {"run": self.run} if self.run is not None else {"read": self.read}
        return {**source, "expect": self.expect, "value": self.value}


@dataclass(frozen=True, kw_only=True)
class Check:
    """One check of a hidden test: the probe, and what its failure means."""

    name: str
    message: str
    probe: Probe


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


def q(text: str) -> str:
    return shlex.quote(text)


def file_is(path: str, text: str) -> Probe:
    """The file holds ``text``, give or take surrounding whitespace."""
    return Probe(read=path, expect="text", value=text)


def lines_are(path: str, lines: list[str]) -> Probe:
    """The file's lines are ``lines`` (trailing spaces and blank ends ignored)."""
    return Probe(read=path, expect="lines", value=lines)


def json_is(path: str, value: object) -> Probe:
    """The file parses as JSON equal to ``value``."""
    return Probe(read=path, expect="json", value=value)


def pairs_are(path: str, pairs: dict[str, str]) -> Probe:
    """The file's ``KEY=value`` words are exactly ``pairs``."""
    return Probe(read=path, expect="pairs", value=pairs)


def lacks(path: str, text: str) -> Probe:
    """The file exists and does not contain ``text``."""
    return Probe(read=path, expect="lacks", value=text)


def output_is(command: str, text: str) -> Probe:
    """``command`` (bash, run in the workdir) exits 0 and prints ``text``, give or take
    whitespace."""
    return Probe(run=command, expect="text", value=text)


def output_lines(command: str, lines: list[str]) -> Probe:
    """``command`` exits 0 and prints ``lines``."""
    return Probe(run=command, expect="lines", value=lines)


def succeeds(command: str) -> Probe:
    """``command`` exits 0 (a command that holds no expected value)."""
    return Probe(run=command, expect="ok")


def word(rng: random.Random, words: tuple[str, ...]) -> str:
    return rng.choice(words)


NAMES: tuple[str, ...] = ("alpha", "bravo", "cedar", "delta", "ember", "fjord", "gamma")
NAMES += ("harbor", "indigo", "juniper", "kestrel", "lumen", "maple", "nimbus", "orchid")
NAMES += ("pylon", "quartz")
PEOPLE: tuple[str, ...] = ("ana", "ben", "chloe", "dev", "eli", "fay", "gus", "hana", "ivan")
PEOPLE += ("jade", "kai")


def only(*, name: str, message: str, probe: Probe) -> tuple[Check, ...]:
    """The checks of a task with one probe."""
    return (Check(name=name, message=message, probe=probe),)
