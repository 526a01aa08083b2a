"""``temper eval``: a policy's held-out capability at three tiers (unit, chain, system).

``temper eval --policy DIR|VERSION --domains A,B`` runs the domains' eval splits as
eval-tier tasks through a dedicated evaluation stack (nats-server, a generator on exactly
those weights, the validator, and the sandbox when a domain runs code) and writes
``report.json``.  A dedicated generator, rather than a version pinned beside the training
policy in a training generator: the training generator keeps one set of weights and all
its slots for training, and swaps weights between requests, so an evaluation there would
both slow training and measure a moving target.  (During ``temper train`` the periodic
evaluation does run on the training stack, at the eval tier: it measures the version
being served, which is what a training curve wants.)

``temper eval --compare A B`` prints per-tier deltas with intervals and flags
regressions; A and B are report files (or directories holding ``report.json``) or
policies, evaluated first.  It exits 1 when a regression is flagged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.errors import DecodeError
from protocol.messages import ScoredRollout
from services.cli.common import CliError, connect, run
from services.evaluation.report.eval_page import write_pages
from services.evaluation.suite import EvalSuite, SuitePlan, domains_needing_sandbox
from services.supervisor import StackSettings, Supervisor

_SCORED: Codec[ScoredRollout] = Codec(ScoredRollout)
_REPORT = "report.json"


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "eval", help="held-out unit, chain and system figures of a policy; --compare two"
    )
    parser.add_argument(
        "--policy", help="model directory, or a published version number of --run-dir"
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=Path("run/train"),
        help="run whose published weights a VERSION names (default %(default)s)",
    )
    parser.add_argument("--domains", default="arithmetic_sum3", help="comma-separated domain names")
    parser.add_argument("--domains-config", type=Path, help="domain config (TOML)")
    parser.add_argument(
        "--samples", type=int, default=4, help="sampled answers per problem (pass@k's k)"
    )
    parser.add_argument("--limit", type=int, default=200, help="problems per domain, at most")
    parser.add_argument("--out", type=Path, help="report directory (default eval/<policy>)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="give up after this long")
    parser.add_argument("--nats-port", type=int, default=0, help="the eval stack's (0: free)")
    parser.add_argument(
        "--sandbox-backend", default="auto", help="docker, bwrap, subprocess or auto"
    )
    parser.add_argument(
        "--compare", nargs=2, metavar=("A", "B"), help="compare two reports or policies"
    )
    parser.set_defaults(run=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    if args.compare:
        return _compare(args)
    if not args.policy:
        raise CliError("give --policy DIR|VERSION (or --compare A B)", 2)
    report = _evaluate(args, args.policy, args.out)
    return 0 if report["received_rollouts"] >= report["expected_rollouts"] else 1


def _evaluate(args: argparse.Namespace, policy: str, out: Path | None) -> dict[str, Any]:
    model = resolve_policy(policy, args.run_dir)
    plan = SuitePlan(
        domains=tuple(_domains(args.domains, args.domains_config)),
        samples=args.samples,
        limit=args.limit,
    )
    out = (out or Path("eval") / _label(policy)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    suite = EvalSuite(run=f"eval{int(time.time())}", plan=plan)
    _say(f"evaluating {model} on {', '.join(suite.sets)}: {suite.expected()} rollouts")
    stack = _stack(args, model, plan, out / "stack")
    elapsed_s = run(lambda: _run_suite(stack, suite, args.timeout_s))
    version = int(policy) if policy.isdigit() else None
    report = {**suite.report(str(model), version), "elapsed_s": elapsed_s}
    (out / _REPORT).write_text(json.dumps(report, indent=2) + "\n")
    page, notes = write_pages(report, out)
    for line in summary_lines(report):
        print(line)
    print(f"report: {out / _REPORT} ({page.name}, {notes.name})")
    return report


def resolve_policy(policy: str, run_dir: Path) -> Path:
    """A model directory, or ``RUN_DIR/learner/weights/v<N>`` for a version number."""
    if not policy.isdigit():
        path = Path(policy)
        if not (path / "config.json").is_file():
            raise CliError(f"{policy}: not a model directory (no config.json)", 2)
        return path.resolve()
    weights = run_dir / "learner" / "weights"
    path = weights / f"v{int(policy)}"
    if not (path / "config.json").is_file():
        kept = sorted(p.name for p in weights.glob("v*")) if weights.is_dir() else []
        have = f"published versions kept: {', '.join(kept)}" if kept else "none kept"
        raise CliError(f"version {policy} is not in {weights} ({have})", 2)
    return path.resolve()


def _domains(names: str, config: Path | None) -> list[Any]:
    from services.domains import UnknownDomain, load_registry

    registry = load_registry(config)
    try:
        return [registry.get(name.strip()) for name in names.split(",") if name.strip()]
    except UnknownDomain as error:
        raise CliError(str(error), 2) from None


def _label(policy: str) -> str:
    return f"v{policy}" if policy.isdigit() else Path(policy).resolve().name


def _stack(args: argparse.Namespace, model: Path, plan: SuitePlan, run_dir: Path) -> StackSettings:
    from services.runtime.ports import free_port

    sandboxed = domains_needing_sandbox(plan.domains)
    env = {
        "TEMPER_GENERATOR_MODEL": str(model),
        "TEMPER_GENERATOR_TOOLS": "sandbox" if sandboxed else "local",
        "TEMPER_GENERATOR_MAX_CONCURRENT_TASKS": "8",
        "TEMPER_GENERATOR_THREADS": "1",
        "TEMPER_SANDBOX_BACKEND": args.sandbox_backend,
        "TEMPER_SANDBOX_POOL_SIZE": "2",
        "TEMPER_STATS_S": "2",
    }
    if args.domains_config is not None:
        for service in ("GENERATOR", "VALIDATOR"):
            env[f"TEMPER_{service}_DOMAINS_CONFIG"] = str(args.domains_config.resolve())
    services = ("generator", "validator") + (("sandbox",) if sandboxed else ())
    return StackSettings(
        run_dir=run_dir,
        nats_port=args.nats_port or free_port(),
        services=services,
        env=env,
    )


async def _run_suite(settings: StackSettings, suite: EvalSuite, timeout_s: float) -> float:
    """Seconds from the stack's start to the last rollout (or the timeout)."""
    from tqdm import tqdm

    supervisor = Supervisor(settings, say=_say)
    started = time.monotonic()
    try:
        await supervisor.start()
        nc = await connect(supervisor.nats_url, "temper-eval", timeout_s=10.0)
        bar = tqdm(total=suite.expected(), desc="eval rollouts", unit="rollout", file=sys.stderr)

        async def on_scored(msg: Msg) -> None:
            try:
                if suite.add(_SCORED.decode(msg.data)):
                    bar.update(1)
            except DecodeError:
                return

        try:
            await nc.subscribe(subjects.scored_all(), cb=on_scored)
            js = nc.jetstream()
            for task in suite.tasks():
                subject = subjects.of_task(task)
                await js.publish(subject, encode(task), headers={"Nats-Msg-Id": task.id})
            await _until_done(suite, started + timeout_s)
        finally:
            bar.close()
            await nc.close()
    finally:
        await supervisor.stop()
    return round(time.monotonic() - started, 1)


async def _until_done(suite: EvalSuite, deadline: float) -> None:
    while not suite.done():
        if time.monotonic() > deadline:
            missing = suite.expected() - len(suite.outcomes)
            _say(f"timed out with {missing} rollouts missing; the report covers what came")
            return
        await asyncio.sleep(0.25)


def summary_lines(report: dict[str, Any]) -> list[str]:
    """One line per domain: the unit, chain and system headline figures."""
    k = report.get("samples", 0)
    lines = [f"policy {report['policy']} (version {report.get('version')})"]
    for name, domain in report["domains"].items():
        unit, system, chain = domain["unit"], domain["system"], domain.get("chain")
        text = (
            f"{name}: pass@1 {_interval(unit['pass_at_1'])}, pass@{k} "
            f"{unit['pass_at_k']['value']:.1%}, greedy {unit['greedy']['value']:.1%}; "
            f"success {system['success_rate']['value']:.1%}, infra failures "
            f"{system['infra_failure_rate']['value']:.1%}, latency p95 "
            f"{system['latency_s'].get('p95', 0.0):.2f} s"
        )
        if chain:
            text += (
                f"; completion {chain['completion_rate']['value']:.1%}, turns "
                f"{chain['turns']['mean']:.2f}, tool calls {chain['attempts']['mean']:.2f}"
            )
        lines.append(text)
    return lines


def _interval(figure: dict[str, float]) -> str:
    return f"{figure['value']:.1%} [{figure['low']:.1%}, {figure['high']:.1%}]"


def _compare(args: argparse.Namespace) -> int:
    from services.evaluation.compare import compare, format_comparison

    before_name, after_name = args.compare
    before = _load_or_evaluate(args, before_name)
    after = _load_or_evaluate(args, after_name)
    deltas = compare(before, after)
    print(format_comparison(deltas, _short(before_name), _short(after_name)))
    return 1 if any(d.regression for d in deltas) else 0


def _short(name: str) -> str:
    """A column heading: the report's directory or file stem, not the whole path."""
    path = Path(name)
    if path.name == _REPORT:
        path = path.parent
    return path.stem if path.suffix == ".json" else path.name or name


def _load_or_evaluate(args: argparse.Namespace, name: str) -> dict[str, Any]:
    path = Path(name)
    report = path / _REPORT if path.is_dir() else path
    if report.is_file():
        try:
            loaded: dict[str, Any] = json.loads(report.read_text())
        except ValueError as error:
            raise CliError(f"{report}: not a report ({error})", 2) from None
        if "domains" not in loaded:
            raise CliError(f"{report}: not a report (no domains)", 2)
        return loaded
    return _evaluate(args, name, None)


def _say(line: str) -> None:
    from services.cli.train_view import say

    say(line)
