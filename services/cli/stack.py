"""``temper up``, ``serve``, ``status``, ``check``: run the stack and ask how it is."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.client import StackUnavailable, TemperClient
from protocol.messages import Heartbeat, StackStatus
from services import registry
from services.cli import preflight
from services.cli.common import CliError, connect, emit_json, run, stop_event
from services.cli.status_view import print_status
from services.runtime import logs
from services.runtime.ask import AskTimeout, BadReply, NoResponder, Refused, ask
from services.runtime.natsserver import NatsServerError
from services.runtime.service import Service
from services.runtime.settings import SettingsError, from_env
from services.supervisor import StackSettings, Supervisor


def register(commands: Any) -> None:
    up = commands.add_parser("up", help="start nats-server and every service on this machine")
    up.add_argument(
        "--run-dir", type=Path, default=Path("run"), help="state and logs (default: ./run)"
    )
    up.add_argument("--nats-port", type=int, default=4222, help="port of the embedded nats-server")
    up.add_argument(
        "--nats-cluster",
        type=_count,
        default=1,
        metavar="N",
        help="run N nats-servers as one JetStream cluster, on ports from --nats-port "
        "(3 survives the loss of any one)",
    )
    up.add_argument(
        "--nats-route-port", type=int, default=6222, help="route port of the first cluster server"
    )
    up.add_argument(
        "--stream-replicas",
        type=_count,
        metavar="N",
        help="copies of each stream (default: one per cluster server, at most 3)",
    )
    up.add_argument(
        "--external-nats", action="store_true", help="use --nats-url instead of starting one"
    )
    up.add_argument(
        "--service",
        action="append",
        dest="services",
        metavar="NAME",
        help="run only these services (repeatable; default: all registered)",
    )
    up.add_argument(
        "--grace", type=float, default=30.0, help="seconds services get to drain on stop"
    )
    up.add_argument(
        "--model",
        type=Path,
        help="policy directory, Hugging Face format (default: RUN_DIR/model, made by "
        "`temper model init` when missing)",
    )
    up.add_argument(
        "--engine", choices=("torch", "sglang"), default="torch", help="generator engine"
    )
    up.add_argument(
        "--sglang-url",
        action="append",
        dest="sglang_urls",
        metavar="URL",
        help="SGLang server for --engine sglang (repeatable: turns stick to one server)",
    )
    up.add_argument(
        "--metrics-port-base",
        type=int,
        default=registry.METRICS_PORT_BASE,
        metavar="PORT",
        help="/metrics of each service on 127.0.0.1, port PORT + its place: control, "
        "generator, learner, replay, sandbox, validator (default: %(default)s; 0: free ports)",
    )
    up.add_argument("--no-metrics", action="store_true", help="serve no /metrics")
    up.add_argument(
        "--config",
        type=Path,
        metavar="RUN.toml",
        help="a run config (deploy/runs/): the feeder starts with its mix, and every service "
        "reads its domains",
    )
    up.set_defaults(run=cmd_up)

    serve = commands.add_parser("serve", help="run one service in the foreground")
    serve.add_argument("name", help=f"service name ({', '.join(sorted(registry.entries()))})")
    serve.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="learner only: run N data-parallel ranks here (execs torchrun --standalone; "
        "several hosts: run torchrun yourself, docs/operations.md)",
    )
    serve.set_defaults(run=cmd_serve)

    status = commands.add_parser("status", help="services, streams and dead letters of the stack")
    status.add_argument("--json", action="store_true", help="print the StackStatus as JSON")
    status.add_argument("--timeout", type=float, default=2.0)
    status.set_defaults(run=cmd_status)

    check = commands.add_parser("check", help="exit 0 if SERVICE answers healthy, else 1")
    check.add_argument("service")
    check.add_argument("--timeout", type=float, default=2.0)
    check.set_defaults(run=cmd_check)


# ---------------------------------------------------------------- up


def cmd_up(args: argparse.Namespace) -> int:
    configured = run_config_env(args)
    names = tuple(args.services or registry.default_services({**os.environ, **configured}))
    for name in names:
        try:
            registry.lookup(name)
        except registry.UnknownService as error:
            raise CliError(str(error), 2) from None
    preflight.check_stack(names, os.environ)
    copies, servers = args.stream_replicas or 1, args.nats_cluster
    if copies > servers and not args.external_nats:
        raise CliError(f"--stream-replicas {copies} needs as many servers: --nats-cluster", 2)
    settings = StackSettings(
        run_dir=args.run_dir,
        nats_port=args.nats_port,
        nats_url=args.nats_url if args.external_nats else None,
        nats_cluster=args.nats_cluster,
        nats_route_port=args.nats_route_port,
        stream_replicas=args.stream_replicas,
        services=names,
        stop_grace_s=args.grace,
        env={**policy_env(args, names), **configured},
        metrics_ports=metrics_ports(args, names),
    )
    try:
        return run(lambda: _up(settings))
    except NatsServerError as error:
        raise CliError(str(error)) from None


def run_config_env(args: argparse.Namespace) -> dict[str, str]:
    """The services' environment from ``--config``, if given (``temper train``'s reading)."""
    if args.config is None:
        return {}
    from services.cli.train import up_env

    return up_env(args.config, args.run_dir.resolve())


def metrics_ports(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, int]:
    if args.no_metrics:
        return {}
    ports = registry.metrics_ports(names, args.metrics_port_base)
    if not all(0 <= port <= 65535 for port in ports.values()):
        raise CliError(f"--metrics-port-base {args.metrics_port_base}: ports out of range", 2)
    return ports


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, not {value}")
    return value


def _shared_threads(environ: Mapping[str, str]) -> dict[str, str]:
    """Torch threads of the generator and the learner, which share this machine's cores:
    half each.  A pool as wide as the machine spins on cores the other process (or the
    gateway, the validator) holds: on 2 cores that doubled the generator's CPU per call
    in bench/bench_gateway.py.  A setting in the environment is left as it is."""
    half = str(max(1, (os.cpu_count() or 2) // 2))
    names = ("TEMPER_GENERATOR_THREADS", "TEMPER_LEARNER_THREADS")
    return {name: half for name in names if name not in environ}


def policy_env(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, str]:
    """Generator, learner and gateway settings from the command line (``TEMPER_<SERVICE>_*``).

    All start from the same policy directory; the learner writes its versions, checkpoint
    and metrics under RUN_DIR/learner.
    """
    if not {"generator", "learner", "gateway"} & set(names):
        return {}
    if args.engine == "sglang" and not args.sglang_urls:
        raise CliError("--engine sglang needs at least one --sglang-url", 2)
    model = (args.model or args.run_dir / "model").resolve()
    if not (model / "config.json").is_file():
        if args.model is not None:
            raise CliError(f"{model}: not a model directory (no config.json)", 2)
        from services.model.tiny import init_model

        _say(f"no policy yet: building the tiny one in {model} (temper model init)")
        init_model(model, force=True)
    env = {
        "TEMPER_GENERATOR_MODEL": str(model),
        "TEMPER_GENERATOR_ENGINE": args.engine,
        "TEMPER_LEARNER_MODEL": str(model),
        "TEMPER_LEARNER_OUT_DIR": str((args.run_dir / "learner").resolve()),
        # The gateway tokenizes with the policy the generators serve, and journals its
        # open sessions under the run (lost ones are reported after a crash).
        "TEMPER_GATEWAY_MODEL": str(model),
        "TEMPER_GATEWAY_STATE_DIR": str((args.run_dir / "gateway").resolve()),
    }
    if args.sglang_urls:
        env["TEMPER_GENERATOR_SGLANG_URLS"] = ",".join(args.sglang_urls)
    env.update(_shared_threads(os.environ))
    # The validator's domains are the learner's (it refuses rewards outside a domain's
    # range) and the gateway's (the problems of sessions the validators score).
    validator_domains = os.environ.get("TEMPER_VALIDATOR_DOMAINS_CONFIG")
    for reader in ("TEMPER_LEARNER_DOMAINS_CONFIG", "TEMPER_GATEWAY_DOMAINS_CONFIG"):
        if validator_domains and reader not in os.environ:
            env[reader] = str(Path(validator_domains).resolve())
    return env


async def _up(settings: StackSettings) -> int:
    stop = stop_event()
    supervisor = Supervisor(settings, say=_say)
    try:
        await supervisor.start()
        await _report_health(supervisor.nats_url, settings.services, stop)
        _say(f"stack up: `temper --nats-url {supervisor.nats_url} status`; Ctrl-C stops everything")
        await supervisor.watch(stop)
    finally:
        await supervisor.stop()
    return 0


async def _report_health(
    url: str, names: tuple[str, ...], stop: asyncio.Event, wait_s: float = 30.0
) -> None:
    nc = await connect(url, "temper-up")
    try:
        deadline = time.monotonic() + wait_s
        pending = set(names)
        while pending and not stop.is_set() and time.monotonic() < deadline:
            for name in sorted(pending):
                beat = await _health(nc, name, 0.5)
                if beat is not None and beat.healthy:
                    metrics = f", metrics {beat.metrics_url}" if beat.metrics_url else ""
                    _say(f"{name:<12} healthy{metrics}")
                    pending.discard(name)
            await asyncio.sleep(0.2)
        for name in sorted(pending):
            _say(f"{name:<12} not healthy yet (see its log)")
    finally:
        await nc.close()


def _say(line: str) -> None:
    print(f"[temper {time.strftime('%H:%M:%S')}] {line}", flush=True)


# ---------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    if args.nproc is not None:
        _exec_torchrun(args.name, args.nproc)
    if args.name == "learner" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return _serve_rank()
    try:
        service = registry.build(args.name, os.environ)
    except (registry.UnknownService, SettingsError) as error:
        raise CliError(str(error), 2) from None
    logs.configure(service.name, service.runtime.log_level)
    return run(lambda: _serve(service))


def _exec_torchrun(name: str, nproc: int) -> None:
    """Become torchrun, which starts ``temper serve learner`` once per rank."""
    if name != "learner" or nproc < 1:
        raise CliError("--nproc N (N >= 1) runs the learner only", 2)
    from services.learner.ranks import torchrun_command

    command = torchrun_command(nproc)
    os.execv(command[0], command)


def _serve_rank() -> int:
    """One rank of the learner under torchrun: rank 0 serves, the others follow it."""
    from services.learner import ranks
    from services.learner.distributed import ParallelSettings
    from services.learner.settings import LearnerSettings

    parallel = ParallelSettings.from_env(os.environ)
    if parallel is None:
        raise CliError("WORLD_SIZE is set without RANK: start the learner with torchrun", 2)
    try:
        settings = from_env(LearnerSettings, "TEMPER_LEARNER_", os.environ)
    except SettingsError as error:
        raise CliError(str(error), 2) from None
    logs.configure("learner", settings.runtime.log_level)
    return ranks.serve(settings, parallel, lambda service: run(lambda: _serve(service)))


async def _serve(service: Service) -> int:
    """Run until SIGTERM/SIGINT (graceful) or a crash (exit 1, the supervisor restarts it)."""
    stop = stop_event()
    await service.start()
    stopper = asyncio.ensure_future(stop.wait())
    crashed = asyncio.ensure_future(service.crashed.wait())
    await asyncio.wait([stopper, crashed], return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    crashed.cancel()
    await service.stop()
    return 1 if service.failure is not None else 0


# ---------------------------------------------------------------- status / check


def cmd_status(args: argparse.Namespace) -> int:
    return run(lambda: _status(args.nats_url, args.timeout, args.json))


async def _status(url: str, timeout_s: float, as_json: bool) -> int:
    async with TemperClient(await connect(url, "temper-status")) as client:
        try:
            status = await client.status(timeout_s=timeout_s)
        except StackUnavailable:
            return await _status_without_control(client, timeout_s)
    if as_json:
        emit_json(status)
    else:
        print_status(url, status)
    return 0 if _healthy(status) else 1


def _healthy(status: StackStatus) -> bool:
    """Every instance still there is healthy, and every service has one.  A gone instance
    whose service was restarted does not make the stack sick; a service whose only
    instance is gone does."""
    present = [s for s in status.services if not s.gone]
    missing = {s.service for s in status.services} - {s.service for s in present}
    return bool(present) and not missing and all(s.healthy for s in present)


async def _status_without_control(client: TemperClient, timeout_s: float) -> int:
    beats = await client.ping(timeout_s=timeout_s)
    print("NATS         reachable; no control service answered (is `control` running?)")
    for beat in sorted(beats, key=lambda b: (b.service, b.instance)):
        health = "healthy" if beat.healthy else "UNHEALTHY"
        line = f"{beat.service:<12} {beat.instance:<24} {beat.state.value:<9} {health:<10}"
        print(f"{line} {beat.metrics_url}".rstrip())
    return 1


def cmd_check(args: argparse.Namespace) -> int:
    return run(lambda: _check(args.nats_url, args.service, args.timeout))


async def _check(url: str, service: str, timeout_s: float) -> int:
    nc = await connect(url, "temper-check")
    try:
        beat = await _health(nc, service, timeout_s)
    finally:
        await nc.close()
    if beat is None:
        print(f"{service}: no answer within {timeout_s}s", file=sys.stderr)
        return 1
    verdict = "healthy" if beat.healthy else "UNHEALTHY"
    detail = f" {beat.detail}" if beat.detail else ""
    print(f"{service}: {verdict} ({beat.state.value}, instance {beat.instance}){detail}")
    return 0 if beat.healthy else 1


async def _health(nc: NATS, service: str, timeout_s: float) -> Heartbeat | None:
    try:
        return await ask(nc, subjects.health(service), None, Heartbeat, timeout_s)
    except (NoResponder, AskTimeout, BadReply, Refused):  # a broken connection goes up
        return None
