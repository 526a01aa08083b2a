"""``temper``: run the stack, talk to it, debug it.

The CLI is the only place that reads the environment or the command line; it
builds settings objects and hands them to the services.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from services.cli import (
    dlq,
    domain_control,
    domains,
    evaluate,
    ledger,
    messages,
    model,
    report,
    sandbox,
    stack,
    train,
)
from services.cli.common import CliError

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def build_parser() -> argparse.ArgumentParser:
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
    stack.register(commands)
    messages.register(commands)
    dlq.register(commands)
    sandbox.register(commands)
    domains.register(commands)
    domain_control.register(commands)
    model.register(commands)
    ledger.register(commands)
    report.register(commands)
    evaluate.register(commands)
    train.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
