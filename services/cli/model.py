"""``temper model init DIR``: build the tiny local policy (no download)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from services.cli.common import CliError


def register(commands: Any) -> None:
    model = commands.add_parser("model", help="model directories (Hugging Face format)")
    actions = model.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = actions.add_parser("init", help="write a tiny Qwen2 policy and tokenizer to DIR")
    init.add_argument("dir", type=Path, help="target directory (created; must be empty)")
    init.add_argument("--layers", type=int, default=2)
    init.add_argument("--hidden", type=int, default=128, help="hidden size")
    init.add_argument("--vocab", type=int, default=2048, help="tokenizer vocabulary size")
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--force", action="store_true", help="overwrite a non-empty DIR")
    init.set_defaults(run=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    from services.model.tiny import ModelDirError, TinyModelSpec, init_model

    if args.hidden % 4 or args.hidden <= 0 or args.layers <= 0 or args.vocab < 300:
        raise CliError("need --hidden a positive multiple of 4, --layers >= 1, --vocab >= 300", 2)
    spec = TinyModelSpec(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        layers=args.layers,
        seed=args.seed,
    )
    try:
        path = init_model(args.dir, spec, force=args.force)
    except ModelDirError as error:
        raise CliError(str(error), 2) from error
    print(f"tiny policy written to {path}")
    return 0
