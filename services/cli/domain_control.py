"""``temper domain status|resume|weight``: how the generators schedule each domain.

Every generator instance answers on ``temper.v1.control.domain``: its fair-share weights,
tasks started and in flight per domain (and per tenant of a domain that has tenants),
and the domains it holds in quarantine.  A
resume or a weight applies to every instance that answers; a weight lasts until the
instance restarts (``share_weight`` in the domain config is the lasting one).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from protocol.client import TemperClient
from protocol.messages import DomainControl, DomainSchedules, TenantSchedule
from services.cli.common import CliError, emit_json, run


def register(commands: Any) -> None:
    domain = commands.add_parser(
        "domain", help="generators' scheduling of domains: status, resume, weight"
    )
    actions = domain.add_subparsers(dest="action", required=True, metavar="ACTION")
    status = actions.add_parser("status", help="per instance: weights, in flight, quarantined")
    status.add_argument("--json", action="store_true", help="print the answers as JSON")
    status.set_defaults(run=cmd_status)
    resume = actions.add_parser("resume", help="lift a domain's quarantine on every generator")
    resume.add_argument("name")
    resume.set_defaults(run=cmd_resume)
    weight = actions.add_parser("weight", help="set a domain's fair-share weight at run time")
    weight.add_argument("name")
    weight.add_argument("weight", type=float)
    weight.set_defaults(run=cmd_weight)
    for parser in (status, resume, weight):
        parser.add_argument(
            "--timeout", type=float, default=1.0, help="seconds to collect generators' answers"
        )


async def _send(url: str, request: DomainControl, timeout_s: float) -> list[DomainSchedules]:
    async with await TemperClient.connect(url) as client:
        answers = await client.domain_control(request, timeout_s=timeout_s)
    if not answers:
        raise CliError(f"no generator answered within {timeout_s}s (is the stack up?)")
    return sorted(answers, key=lambda a: a.instance)


def cmd_status(args: argparse.Namespace) -> int:
    answers = run(lambda: _send(args.nats_url, DomainControl(), args.timeout))
    if args.json:
        emit_json(answers)
        return 0
    for line in describe(answers):
        print(line)
    return 0


def describe(answers: list[DomainSchedules]) -> list[str]:
    lines = []
    for answer in answers:
        lines.append(f"{answer.instance}")
        if not answer.domains:
            lines.append("  no domain scheduled yet")
        for d in answer.domains:
            lines.append(
                f"  {d.domain:<32} {d.state:<12} weight {d.share_weight:<6g} "
                f"started {d.started:<7} in flight {d.in_flight:<4}"
                + (f" infra failures {d.failure_rate:.0%}" if d.state != "active" else "")
            )
            lines.extend(_tenant_line(t) for t in d.tenants)
    return lines


def _tenant_line(tenant: TenantSchedule) -> str:
    # Under its domain, aligned with the domain's counts (the tenants share its weight).
    name = tenant.tenant or "(default tenant)"
    return f"    {name:<58}started {tenant.started:<7} in flight {tenant.in_flight:<4}"


def cmd_resume(args: argparse.Namespace) -> int:
    request = DomainControl(domain=args.name, resume=True)
    answers = run(lambda: _send(args.nats_url, request, args.timeout))
    resumed = [a.instance for a in answers if a.applied]
    if resumed:
        print(f"{args.name}: resumed on {', '.join(resumed)}")
    else:
        print(f"{args.name}: not quarantined on any of {len(answers)} generator(s)")
    return 0


def cmd_weight(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.weight) and args.weight > 0):
        raise CliError(f"weight must be a positive number, not {args.weight}")
    request = DomainControl(domain=args.name, share_weight=args.weight)
    answers = run(lambda: _send(args.nats_url, request, args.timeout))
    print(f"{args.name}: weight {args.weight:g} on {len(answers)} generator(s)")
    return 0
