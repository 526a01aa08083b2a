"""A ``temper`` command registers (and imports) only its own module's commands."""

from __future__ import annotations

import argparse
import importlib

import pytest

from services.cli import COMMANDS, build_parser, command_of


def choices(parser: argparse.ArgumentParser) -> list[str]:
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(commands.choices)


def registered_by(module: str) -> list[str]:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    importlib.import_module(f"services.cli.{module}").register(commands)
    return choices(parser)


@pytest.mark.parametrize("module", sorted(set(COMMANDS.values())))
def test_the_table_names_exactly_what_each_module_registers(module: str) -> None:
    assert registered_by(module) == [c for c, m in COMMANDS.items() if m == module]


def test_a_command_builds_only_its_modules_commands_and_anything_else_builds_all() -> None:
    assert choices(build_parser("submit")) == ["submit", "tail", "record", "replay"]
    assert choices(build_parser("eval")) == ["eval"]
    everything = choices(build_parser(None))
    assert sorted(everything) == sorted(COMMANDS)
    # A typo gets argparse's list of every command, not a parser that knows none.
    assert choices(build_parser("sbumit")) == everything


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["submit", "x.jsonl"], "submit"),
        (["--nats-url", "nats://h:1", "status"], "status"),
        (["--nats-url=nats://h:1", "tail", "x"], "tail"),
        (["--help"], None),
        ([], None),
        (["--nats-url"], None),
    ],
)
def test_the_command_word_skips_options_and_their_values(
    argv: list[str], command: str | None
) -> None:
    assert command_of(argv) == command
