"""``temper``: run the stack, talk to it, debug it.

The CLI is the only place that reads the environment or the command line; it
builds settings objects and hands them to the services.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from services.cli.common import CliError

#: The module that registers each command: a command imports only its own module (a
#: ``temper`` process starts in a fraction of a second, not after every command's imports).
#: In help order; tests/unit/test_cli_lazy.py checks it against what the modules register.
COMMANDS: dict[str, str] = {
    "up": "stack",
    "serve": "stack",
    "status": "stack",
    "check": "stack",
    "submit": "messages",
    "tail": "messages",
    "record": "messages",
    "replay": "messages",
    "dlq": "dlq",
    "sandbox": "sandbox",
    "domains": "domains",
    "domain": "domain_control",
    "model": "model",
    "ledger": "ledger",
    "report": "report",
    "eval": "evaluate",
    "train": "train",
}

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone when it is one of them."""
    parser = argparse.ArgumentParser(
        prog="temper",
        description="Asynchronous off-policy RL post-training over NATS.",
    )
    parser.add_argument(
        "--nats-url",
        default=os.environ.get("TEMPER_NATS_URL", DEFAULT_NATS_URL),
        help="NATS server to talk to (env TEMPER_NATS_URL; default %(default)s)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for module in wanted:
        importlib.import_module(f"services.cli.{module}").register(commands)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The command word of ``argv`` (the first word that is no option or option value)."""
    words = iter(argv)
    for word in words:
        if word == "--nats-url":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(command_of(words)).parse_args(words)
    try:
        return int(args.run(args))
    except CliError as error:
        print(f"temper: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and friends: stop quietly, as shell tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
