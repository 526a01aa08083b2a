"""``temper domains [--json] [NAME ...]``: the domains the stack serves, and how to build tasks.

The answer comes from a validator on ``temper.v1.domains`` (it loads the registry and
knows what its judges read); ``--local`` describes this machine's registry instead,
without a stack.  ``temper domains export --harbor DIR [--template NAME ...]`` writes
the built-in terminal templates as Harbor task folders (services/domains/harbor_export.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from protocol.client import StackUnavailable, TemperClient
from protocol.errors import RemoteError
from protocol.messages import DomainInfo, DomainList, DomainsRequest
from services.cli.common import CliError, connect, emit_json, run

#: ``temper domains export ...``: the first NAME selects the export, not a domain.
EXPORT = "export"


def register(commands: Any) -> None:
    domains = commands.add_parser(
        "domains", help="served domains: prompt format, metadata keys, validators, eval split"
    )
    domains.add_argument("names", nargs="*", metavar="NAME", help="only these domains")
    domains.add_argument("--json", action="store_true", help="print the DomainList as JSON")
    domains.add_argument(
        "--examples", action="store_true", help="include one example task per domain"
    )
    domains.add_argument(
        "--local",
        action="store_true",
        help="describe this machine's registry (built-ins and plugins) instead of asking the stack",
    )
    domains.add_argument(
        "--domains-config", type=Path, help="with --local: a domains TOML file or folder"
    )
    domains.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait for a validator (its first answer counts held-out problems)",
    )
    export = domains.add_argument_group(
        "export", "temper domains export --harbor DIR: terminal templates as Harbor tasks"
    )
    export.add_argument("--harbor", type=Path, metavar="DIR", help="write one task folder each")
    export.add_argument(
        "--template",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help="only these terminal templates (default: all)",
    )
    export.add_argument("--seed", type=int, default=0, help="the seed each task is drawn with")
    export.add_argument(
        "--base", default=None, metavar="IMAGE", help="the Dockerfiles' FROM (the sandbox image)"
    )
    domains.set_defaults(run=cmd_domains)


def cmd_domains(args: argparse.Namespace) -> int:
    if args.names[:1] == [EXPORT] or args.harbor is not None:
        return cmd_export(args)
    request = DomainsRequest(names=list(args.names), examples=args.examples)
    if args.local:
        listing = run(lambda: _local(request, args.domains_config))
    else:
        listing = run(lambda: _remote(args.nats_url, request, args.timeout))
    if args.json:
        emit_json(listing)
    else:
        for line in describe(listing):
            print(line)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from services.domains.harbor import SANDBOX_IMAGE
    from services.domains.harbor_export import ExportError, export_templates

    if args.names != [EXPORT] or args.harbor is None:
        raise CliError("usage: temper domains export --harbor DIR [--template NAME ...]", 2)
    try:
        written = export_templates(
            args.harbor, args.template, seed=args.seed, base=args.base or SANDBOX_IMAGE
        )
    except ExportError as error:
        raise CliError(str(error), 2) from None
    except OSError as error:
        raise CliError(f"cannot write under {args.harbor}: {error}", 1) from None
    for path in written:
        print(path)
    print(f"{len(written)} Harbor tasks written to {args.harbor}", file=sys.stderr)
    return 0


async def _remote(url: str, request: DomainsRequest, timeout_s: float) -> DomainList:
    async with TemperClient(await connect(url, "temper-domains")) as client:
        try:
            return await client.domains(
                request.names, examples=request.examples, timeout_s=timeout_s
            )
        except (StackUnavailable, RemoteError) as error:
            raise CliError(str(error)) from None


async def _local(request: DomainsRequest, config: Path | None) -> DomainList:
    from services.domains import ConfigError, DomainError, load_registry
    from services.runtime.errors import RequestRejected
    from services.validator.catalog import Catalog

    try:
        registry = load_registry(config)
    except (ConfigError, DomainError) as error:
        raise CliError(str(error), 2) from None
    try:
        return await Catalog(registry, validator="local").answer(request, max_payload=1 << 40)
    except RequestRejected as error:
        raise CliError(error.message, 2) from None


def describe(listing: DomainList) -> list[str]:
    """Human-readable lines, one block per domain."""
    lines = [f"{len(listing.domains)} domains (answered by {listing.validator or '?'})"]
    for info in listing.domains:
        lines.append("")
        lines.extend(_block(info))
    return lines


def _block(info: DomainInfo) -> list[str]:
    judges = ", ".join(
        f"{v.name} ({v.kind}) x{v.weight:g}" if v.name != v.kind else f"{v.kind} x{v.weight:g}"
        for v in info.validators
    )
    held_out = "not counted" if info.eval_size is None else f"{info.eval_size} problems"
    lines = [
        f"{info.name}  [{info.kind or 'custom'}]  {info.description}".rstrip(),
        f"  prompt      system: {info.prompt_system!r}",
        f"              user:   {info.prompt_template!r}",
        f"  metadata    {', '.join(info.metadata_keys) or '(none needed)'}",
        f"  validators  {judges}",
        f"  task        tier {info.tier}, n {info.samples}, max_tokens {info.max_tokens}, "
        f"max_turns {info.max_turns}, tools {', '.join(info.tools) or 'none'}",
        f"  eval split  {info.eval_fraction:g} of problems; {held_out}",
    ]
    if info.example is not None:
        lines.append(f"  example     id {info.example.id}, metadata {info.example.metadata}")
    return lines
