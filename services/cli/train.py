"""``temper train``: the embedded stack trains a policy on a mix of domains and shows it learning.

One command runs everything on this machine: nats-server, generator (torch engine),
validator, replay and learner, plus a feeder that keeps tasks of the mix flowing, drawn
by domain weight.  The eval domains' held-out problems (their eval splits, never trained
on) are evaluated through the same stack at the eval tier: at the start, every
``--eval-every`` versions and at the end.  A progress bar shows steps, trained
samples/s, reward and held-out accuracy; ``RUN_DIR`` gets ``eval/heldout.jsonl`` (a line
per domain per evaluation; ``heldout_macro.jsonl``, their macro average, with several
domains), TensorBoard scalars and ``train.png``.

Settings come from ``--config RUN.toml`` (services/cli/runconfig; every key is also a
flag, and a flag wins) and ``--print-config`` shows what a run would use.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS

from services.cli.common import CliError, connect, run, stop_event
from services.cli.runconfig import (
    RunConfigError,
    RunDomains,
    TrainPlan,
    add_flags,
    load_domains,
    plan_of,
    to_toml,
)
from services.cli.runconfig.reading import Layer, read_file, resolve
from services.cli.stack_stats import LastStats, fed_lines
from services.cli.train_policy import prepare_policy
from services.cli.train_view import Progress, heldout_lines, plot, say, summary
from services.evaluation.heldout import HeldoutSet
from services.evaluation.runner import HeldoutRunner, RoundResult
from services.evaluation.suite import domains_needing_sandbox, tier_scalars
from services.runtime.natsserver import NatsServerError
from services.supervisor import StackSettings, Supervisor

__all__ = ["SERVICES", "TrainPlan", "cmd_train", "prepare_policy", "register"]

SERVICES = ("control", "feeder", "generator", "validator", "replay", "learner")
#: Longest wait for the final held-out evaluation once training time is up.
_FINAL_EVAL_S = 180.0
#: Warm sandboxes of a run whose domains run code (``TEMPER_SANDBOX_POOL_SIZE`` overrides).
#: A sample holds its sandbox from its first tool call to its last turn, through the
#: generation of the turns between: with too few, samples queue for one while the engine
#: decodes a handful of rows.  An idle one costs a sleeping process.  On the tool run
#: (deploy/runs/tools.toml, 4 minutes, 2 cores) 2 -> 12 took the tool time per sample from
#: 1.9 s to 0.18 s, the rows per decode step from 7 to 19, learner steps from 34 to 46.
SANDBOX_POOL = 12


def register(commands: Any) -> None:
    train = commands.add_parser(
        "train", help="train the tiny policy on the embedded stack and show the reward rising"
    )
    add_flags(train)
    train.add_argument("--fresh", action="store_true", help="start over (delete RUN_DIR)")
    train.add_argument(
        "--warmup-only", action="store_true", help="build and warm up the start policy, then stop"
    )
    train.set_defaults(run=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    try:
        plan = plan_of(args)
        if args.print_config:
            return _print_config(plan)
        if args.fresh:
            import shutil

            shutil.rmtree(plan.run_dir, ignore_errors=True)
        domains = load_domains(plan, plan.run_dir / "domains")
    except RunConfigError as error:
        raise CliError(str(error), 2) from None
    model = prepare_policy(plan, domains)
    if args.warmup_only:
        say(f"start policy ready in {model}")
        return 0
    try:
        return run(lambda: _train(plan, domains, model))
    except NatsServerError as error:
        raise CliError(str(error)) from None


def _print_config(plan: TrainPlan) -> int:
    """Print the plan once its domains load (in a scratch folder: nothing of the run moves)."""
    with tempfile.TemporaryDirectory(prefix="temper-config-") as scratch:
        load_domains(plan, Path(scratch) / "domains")
    print(to_toml(plan), end="", flush=True)
    return 0


async def _train(plan: TrainPlan, domains: RunDomains, model: Path) -> int:
    stop = stop_event()
    supervisor = Supervisor(_stack(plan, domains, model), say=say)
    try:
        await supervisor.start()
        nc = await connect(supervisor.nats_url, "temper-train", ride_through=True)
        try:
            outcome = await _run_until_done(plan, domains, nc, supervisor, stop)
        finally:
            await nc.close()
    finally:
        await supervisor.stop()
    for line in summary(outcome.steps, outcome.heldout) + outcome.fed:
        say(line)
    figure = plan.run_dir / "train.png"
    plot(figure, outcome.steps, outcome.heldout, outcome.started_at)
    say(f"plot: {figure}; TensorBoard: tensorboard --logdir {plan.run_dir}")
    return 0


def _stack(plan: TrainPlan, domains: RunDomains, model: Path) -> StackSettings:
    env = {
        "TEMPER_GENERATOR_MODEL": str(model),
        "TEMPER_GENERATOR_TOOLS": "local",
        "TEMPER_GENERATOR_MAX_CONCURRENT_TASKS": "8",
        # Two busy processes on two cores: one torch thread each, so neither's thread pool
        # spins waiting for a core the other holds.
        "TEMPER_GENERATOR_THREADS": "1",
        # Admission by staleness: a sample started at version v is trained on at a version
        # up to (room / batch - 1) later, so (staleness + 1) batches of room keep every
        # sample within the bound; one batch makes the loop synchronous.
        "TEMPER_GENERATOR_ADMISSION_SAMPLES": str(plan.batch * (plan.max_staleness + 1)),
        "TEMPER_REPLAY_MAX_STALENESS": str(plan.max_staleness),
        "TEMPER_LEARNER_THREADS": "1",
        "TEMPER_LEARNER_MODEL": str(model),
        "TEMPER_LEARNER_OUT_DIR": str(plan.run_dir / "learner"),
        "TEMPER_LEARNER_BATCH_SIZE": str(plan.batch),
        "TEMPER_LEARNER_MIN_SAMPLES": str(_min_samples(plan)),
        "TEMPER_LEARNER_MICRO_BATCH": "64",
        "TEMPER_LEARNER_MINIBATCHES": str(plan.minibatches),
        "TEMPER_LEARNER_LR": str(plan.lr),
        "TEMPER_LEARNER_LR_DECAY_STEPS": str(plan.lr_decay_steps),
        "TEMPER_LEARNER_MAX_STALENESS": str(plan.max_staleness),
        # The learner stops at --max-steps itself: the final evaluation then sees that version.
        "TEMPER_LEARNER_MAX_STEPS": str(plan.max_steps),
        # A checkpoint of the tiny policy takes ~15 ms: every other batch keeps the leased
        # (trained, not yet committed) rollouts well inside the replay buffer's capacity.
        "TEMPER_LEARNER_CHECKPOINT_EVERY": "2",
        "TEMPER_STATS_S": "2",
        **_feeder_env(plan, domains),
    }
    services = SERVICES + _domain_env(domains, env)
    return StackSettings(run_dir=plan.run_dir, nats_port=plan.nats_port, services=services, env=env)


def _domain_env(domains: RunDomains, env: dict[str, str]) -> tuple[str, ...]:
    """Point the services at the run's domains; the sandbox service joins the stack when a
    domain's tools or tests run code.  Returns the services to add."""
    env.update(_domains_config_env(domains))
    every = [domain for domain, _ in domains.train] + list(domains.eval)
    if not domains_needing_sandbox(every):
        return ()
    from services.cli.preflight import check_stack

    env["TEMPER_GENERATOR_TOOLS"] = "sandbox"
    env["TEMPER_SANDBOX_POOL_SIZE"] = os.environ.get("TEMPER_SANDBOX_POOL_SIZE", str(SANDBOX_POOL))
    check_stack(("validator", "sandbox"), {**os.environ, **env})
    return ("sandbox",)


def _feeder_env(plan: TrainPlan, domains: RunDomains) -> dict[str, str]:
    """The feeder draws the mix, its cursor and pools kept in the run folder."""
    return {
        "TEMPER_FEEDER_MIX": ",".join(f"{d.name}={weight}" for d, weight in domains.train),
        "TEMPER_FEEDER_IN_FLIGHT": str(plan.in_flight),
        "TEMPER_FEEDER_FILTER": plan.feeder_filter,
        "TEMPER_FEEDER_EASY_TAKE": str(plan.easy_take),
        "TEMPER_FEEDER_HARD_TAKE": str(plan.hard_take),
        "TEMPER_FEEDER_GROUP": str(plan.group),
        "TEMPER_FEEDER_SEED": str(plan.seed),
        "TEMPER_FEEDER_STATE_DIR": str(plan.run_dir / "feeder"),
    }


def up_env(config: Path, run_dir: Path) -> dict[str, str]:
    """``temper up --config RUN.toml``: the feeder's mix and every service's domains from a
    run config, the feeder's state under ``run_dir``.  The other keys are ``temper
    train``'s: ``temper up`` takes the services' settings from its flags and environment."""
    try:
        plan = dataclasses.replace(resolve(read_file(config), Layer()), run_dir=run_dir)
        domains = load_domains(plan, run_dir / "domains")
    except RunConfigError as error:
        raise CliError(str(error), 2) from None
    return {**_feeder_env(plan, domains), **_domains_config_env(domains)}


def _domains_config_env(domains: RunDomains) -> dict[str, str]:
    """Every service that builds tasks or scores them reads the run's domains config."""
    if domains.config is None:
        return {}
    path = str(domains.config.resolve())
    return {
        f"TEMPER_{s}_DOMAINS_CONFIG": path for s in ("FEEDER", "GENERATOR", "VALIDATOR", "LEARNER")
    }


def _min_samples(plan: TrainPlan) -> int:
    """Smallest batch the learner trains on: a full one when on-policy, since a partial
    batch would leave the rest of the version's samples to be trained a version late."""
    if plan.max_staleness == 0:
        return plan.batch
    return max(plan.group * 2, plan.batch // 2)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    steps: list[dict[str, Any]]
    heldout: list[RoundResult]
    #: Wall-clock time (``time.time()``) when training started.
    started_at: float
    #: What the feeder drew, per domain.
    fed: list[str]


class _Run:
    """The loop's parts: feeder, held-out runner, metrics and what the user sees."""

    def __init__(self, plan: TrainPlan, domains: RunDomains, nc: NATS) -> None:
        from services.learner.metrics import Scalars

        sets = [HeldoutSet.of(domain, limit=plan.eval_problems) for domain in domains.eval]
        out = plan.run_dir / "eval" / "heldout.jsonl"
        self.runner = HeldoutRunner(nc, sets, plan.eval_samples, out)
        self.scalars = Scalars(plan.run_dir / "tensorboard" / "heldout")
        self.metrics = MetricsTail(plan.run_dir / "learner" / "metrics.jsonl")
        self.progress = Progress(plan.minutes * 60 or None)
        self.steps: list[dict[str, Any]] = []
        counts = ", ".join(f"{len(h.problems)} of {h.domain.name}" for h in sets)
        say(f"held-out: {counts} (problems of the eval split)")

    async def start(self) -> None:
        await self.runner.start()

    def collect(self) -> None:
        self.steps.extend(self.metrics.new_lines())
        for result in self.runner.completed():
            for line in heldout_lines(result):
                say(line)
            self._scalars(result)
        self.progress.update(self.steps, self.runner.results)

    def _scalars(self, result: RoundResult) -> None:
        version = int(result.headline["version"])
        self.scalars.add(result.headline, version, prefix="heldout")
        if len(result.domains) > 1:
            for line in result.domains:
                self.scalars.add(line, version, prefix=f"heldout/{line['domain']}")
        self.scalars.add(tier_scalars(self.runner.tiers[version]), version, "tiers")

    def version(self) -> int:
        return int(self.steps[-1]["version"]) if self.steps else 0


async def _run_until_done(
    plan: TrainPlan, domains: RunDomains, nc: NATS, supervisor: Supervisor, stop: asyncio.Event
) -> Outcome:
    loop = _Run(plan, domains, nc)
    await loop.start()
    last_stats = LastStats()
    await last_stats.start(nc)
    clock = _Clock()
    await loop.runner.submit(clock.elapsed())
    watcher = asyncio.ensure_future(supervisor.watch(stop))
    try:
        await _train_until_done(plan, loop, clock, stop, watcher)
        loop.progress.close()
        if not stop.is_set() and not watcher.done():
            await _final_evaluation(loop, clock)
    finally:
        stop.set()
        await watcher
        loop.scalars.close()
        last_stats.write(plan.run_dir / "stats.json")
    return Outcome(
        steps=loop.steps,
        heldout=loop.runner.results,
        started_at=clock.started_at,
        fed=fed_lines(last_stats),
    )


async def _train_until_done(
    plan: TrainPlan, loop: _Run, clock: _Clock, stop: asyncio.Event, watcher: asyncio.Future[None]
) -> None:
    """Keep the feed topped up and evaluate every ``eval_every`` versions until done."""
    next_eval = plan.eval_every or None
    while not stop.is_set() and not _done(plan, clock, loop.steps) and not watcher.done():
        loop.collect()
        version = loop.version()
        if next_eval is not None and version >= next_eval and not loop.runner.busy:
            if await _while_bus_is_up(loop.runner.submit(clock.elapsed())):
                next_eval = version + plan.eval_every
        await asyncio.sleep(0.5)


async def _while_bus_is_up(work: Coroutine[Any, Any, None]) -> bool:
    """Run ``work``; False when the bus is away (the supervisor restarts a killed
    nats-server, and the connection comes back): the loop tries again on its next turn."""
    try:
        await work
    except (nats.errors.Error, TimeoutError) as error:
        say(f"the bus is unavailable ({type(error).__name__}); retrying")
        return False
    return True


def _done(plan: TrainPlan, clock: _Clock, steps: list[dict[str, Any]]) -> bool:
    if plan.max_steps and steps and int(steps[-1]["step"]) >= plan.max_steps:
        return True
    return bool(plan.minutes) and clock.elapsed() >= plan.minutes * 60


async def _final_evaluation(loop: _Run, clock: _Clock) -> None:
    """Evaluate the last version once the evaluation in flight (if any) is in."""
    await loop.runner.drain(_FINAL_EVAL_S)
    results = loop.runner.results
    if len(results) > 1 and results[-1].headline["version"] == loop.version():
        return  # a periodic evaluation measured the final version already (the start one
        # is never the end one: the summary reads start -> end)
    say("training is done: final held-out evaluation")
    await loop.runner.submit(clock.elapsed())
    deadline = time.monotonic() + _FINAL_EVAL_S
    while loop.runner.busy and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        loop.collect()
    if loop.runner.busy:
        say(f"the final held-out evaluation did not finish in {_FINAL_EVAL_S:.0f} s")


class _Clock:
    def __init__(self) -> None:
        self._start = time.monotonic()
        self.started_at = time.time()

    def elapsed(self) -> float:
        return time.monotonic() - self._start


class MetricsTail:
    """New lines of the learner's metrics.jsonl since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def new_lines(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        with self.path.open() as handle:
            handle.seek(self._offset)
            text = handle.read()
        complete = text[: text.rfind("\n") + 1]
        self._offset += len(complete.encode())
        return [json.loads(line) for line in complete.splitlines() if line.strip()]
