"""``temper train``: the embedded stack trains the tiny policy on a domain and shows it learning.

One command runs everything on this machine: nats-server, generator (torch engine),
validator, replay and learner, plus a feeder that keeps tasks of the domain flowing.
The domain's held-out problems (its eval split, never trained on) are evaluated through
the same stack at the eval tier: at the start, every ``--eval-every`` versions and at
the end.  A progress bar shows steps, trained samples/s, reward and held-out accuracy;
``RUN_DIR`` gets ``eval/heldout.jsonl``, TensorBoard scalars and ``train.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from protocol import subjects
from protocol.codec import encode
from protocol.messages import Task
from services.cli.common import CliError, connect, run, stop_event
from services.cli.stack_stats import LastStats
from services.cli.train_view import Progress, heldout_line, plot, say, summary
from services.evaluation.heldout import HeldoutSet
from services.evaluation.runner import HeldoutRunner
from services.evaluation.suite import tier_scalars
from services.runtime.natsserver import NatsServerError
from services.supervisor import StackSettings, Supervisor

if TYPE_CHECKING:
    from services.domains import Domain
    from services.model.sft import WarmupConfig

SERVICES = ("control", "generator", "validator", "replay", "learner")
_GIVE_UP_S = 300.0
#: Longest wait for the final held-out evaluation once training time is up.
_FINAL_EVAL_S = 180.0


def register(commands: Any) -> None:
    train = commands.add_parser(
        "train", help="train the tiny policy on the embedded stack and show the reward rising"
    )
    train.add_argument("--run-dir", type=Path, default=Path("run/train"))
    train.add_argument("--nats-port", type=int, default=4223)
    train.add_argument("--domain", default="arithmetic_sum3")
    train.add_argument("--minutes", type=float, default=10.0, help="train for this long")
    train.add_argument(
        "--max-steps", type=int, default=0, help="stop after this many learner steps (0: no limit)"
    )
    train.add_argument("--group", type=int, default=8, help="samples per task (GRPO group)")
    train.add_argument("--in-flight", type=int, default=64, help="tasks kept outstanding")
    train.add_argument("--batch", type=int, default=256, help="samples per learner step")
    train.add_argument("--minibatches", type=int, default=2, help="optimizer steps per batch")
    train.add_argument("--lr", type=float, default=3e-4)
    train.add_argument(
        "--lr-decay-steps",
        type=int,
        default=600,
        help="the learning rate falls linearly to a tenth over this many steps (0: constant)",
    )
    train.add_argument(
        "--max-staleness",
        type=int,
        default=2,
        help="policy versions a sample may lag the learner when trained on (admission and "
        "replay bound); 0 trains on-policy: generation waits for each new version",
    )
    train.add_argument(
        "--warmup-steps", type=int, default=600, help="most supervised steps (0: none)"
    )
    train.add_argument(
        "--warmup-target",
        type=float,
        default=0.25,
        help="the warm-up stops when greedy accuracy on train problems reaches this "
        "(0: no target, all --warmup-steps)",
    )
    train.add_argument(
        "--eval-every",
        type=int,
        default=40,
        help="held-out evaluation every N policy versions (0: only at the start and the end)",
    )
    train.add_argument(
        "--eval-samples", type=int, default=4, help="sampled answers per held-out problem (pass@k)"
    )
    train.add_argument("--fresh", action="store_true", help="start over (delete RUN_DIR)")
    train.add_argument(
        "--warmup-only", action="store_true", help="build and warm up the start policy, then stop"
    )
    train.set_defaults(run=cmd_train)


@dataclass(frozen=True, kw_only=True)
class TrainPlan:
    run_dir: Path
    nats_port: int
    domain: str
    minutes: float
    max_steps: int
    group: int
    in_flight: int
    batch: int
    minibatches: int
    lr: float
    lr_decay_steps: int
    max_staleness: int
    warmup_steps: int
    warmup_target: float
    eval_every: int
    eval_samples: int


def cmd_train(args: argparse.Namespace) -> int:
    plan = TrainPlan(
        run_dir=args.run_dir.resolve(),
        nats_port=args.nats_port,
        domain=args.domain,
        minutes=args.minutes,
        max_steps=args.max_steps,
        group=args.group,
        in_flight=args.in_flight,
        batch=args.batch,
        minibatches=args.minibatches,
        lr=args.lr,
        lr_decay_steps=args.lr_decay_steps,
        max_staleness=args.max_staleness,
        warmup_steps=args.warmup_steps,
        warmup_target=args.warmup_target,
        eval_every=args.eval_every,
        eval_samples=args.eval_samples,
    )
    if args.fresh:
        import shutil

        shutil.rmtree(plan.run_dir, ignore_errors=True)
    model = prepare_policy(plan)
    if args.warmup_only:
        say(f"start policy ready in {model}")
        return 0
    try:
        return run(lambda: _train(plan, model))
    except NatsServerError as error:
        raise CliError(str(error)) from None


def prepare_policy(plan: TrainPlan) -> Path:
    """The tiny policy, warmed up once; a later run continues from the learner's checkpoint.

    The warmed start is deterministic, so it is built once per recipe (model code, domain
    code, warm-up settings) in the model cache (``$TEMPER_CACHE``) and copied from there.
    """
    import shutil

    from services.domains import UnknownDomain, load_registry
    from services.model.cache import MODEL_ROOT, cached_model, recipe_key
    from services.model.sft import WarmupConfig

    try:
        domain = load_registry(None).get(plan.domain)
    except UnknownDomain as error:
        raise CliError(str(error), 2) from None
    model = plan.run_dir / "model"
    if (model / "config.json").is_file():
        return model
    config = WarmupConfig(
        steps=plan.warmup_steps,
        lr=1e-3,
        examples=4096,
        target_accuracy=plan.warmup_target,
        check_every=10,
    )
    sources = [*(MODEL_ROOT / "model").glob("*.py"), *(MODEL_ROOT / "domains").rglob("*.py")]
    key = recipe_key([plan.domain, repr(config)], sources)
    start = cached_model(
        "train-start-policy", key, lambda path: _warm_up(plan, domain, config, path)
    )
    say(f"start policy: {start} (built once per recipe, copied into {model})")
    model.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(start, model, dirs_exist_ok=True)
    return model


def _warm_up(plan: TrainPlan, domain: Domain, config: WarmupConfig, model: Path) -> None:
    from services.model.sft import supervised_warmup
    from services.model.tiny import init_model

    say(f"building the tiny policy in {model}")
    init_model(model, force=True)
    if not plan.warmup_steps:
        return
    until = (
        f"up to {plan.warmup_steps} steps, until greedy accuracy on train problems "
        f"reaches {plan.warmup_target:.0%}"
        if plan.warmup_target
        else f"{plan.warmup_steps} steps (no accuracy target)"
    )
    say(f"supervised warm-up on {plan.domain}'s train split: {until}")
    result = supervised_warmup(model, domain, config)
    accuracy = "" if result.train_accuracy is None else f", train {result.train_accuracy:.0%}"
    say(
        f"warm-up done after {result.steps} steps (loss {result.loss:.3f}{accuracy}); "
        "reinforcement learning from here"
    )


async def _train(plan: TrainPlan, model: Path) -> int:
    stop = stop_event()
    supervisor = Supervisor(_stack(plan, model), say=say)
    try:
        await supervisor.start()
        nc = await connect(supervisor.nats_url, "temper-train", ride_through=True)
        try:
            outcome = await _run_until_done(plan, nc, supervisor, stop)
        finally:
            await nc.close()
    finally:
        await supervisor.stop()
    for line in summary(outcome.steps, outcome.heldout):
        say(line)
    figure = plan.run_dir / "train.png"
    plot(figure, outcome.steps, outcome.heldout, outcome.started_at)
    say(f"plot: {figure}; TensorBoard: tensorboard --logdir {plan.run_dir}")
    return 0


def _stack(plan: TrainPlan, model: Path) -> StackSettings:
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
    }
    return StackSettings(run_dir=plan.run_dir, nats_port=plan.nats_port, services=SERVICES, env=env)


def _min_samples(plan: TrainPlan) -> int:
    """Smallest batch the learner trains on: a full one when on-policy, since a partial
    batch would leave the rest of the version's samples to be trained a version late."""
    if plan.max_staleness == 0:
        return plan.batch
    return max(plan.group * 2, plan.batch // 2)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    steps: list[dict[str, Any]]
    heldout: list[dict[str, Any]]
    #: Wall-clock time (``time.time()``) when training started.
    started_at: float


async def _run_until_done(
    plan: TrainPlan, nc: NATS, supervisor: Supervisor, stop: asyncio.Event
) -> Outcome:
    from services.domains import load_registry
    from services.learner.metrics import Scalars

    feeder = Feeder(nc, plan)
    await feeder.start()
    last_stats = LastStats()
    await last_stats.start(nc)
    heldout = HeldoutSet.of(load_registry(None).get(plan.domain))
    runner = HeldoutRunner(nc, heldout, plan.eval_samples, plan.run_dir / "eval" / "heldout.jsonl")
    await runner.start()
    scalars = Scalars(plan.run_dir / "tensorboard" / "heldout")
    metrics = MetricsTail(plan.run_dir / "learner" / "metrics.jsonl")
    clock = _Clock()
    say(f"held-out: {len(heldout.problems)} {plan.domain} problems of the eval split")
    await runner.submit(clock.elapsed())
    watcher = asyncio.ensure_future(supervisor.watch(stop))
    steps: list[dict[str, Any]] = []
    progress = Progress(plan.minutes * 60)

    def collect() -> None:
        steps.extend(metrics.new_lines())
        for result in runner.completed():
            say(heldout_line(result))
            scalars.add(result, result["version"], prefix="heldout")
            scalars.add(tier_scalars(runner.tiers[result["version"]]), result["version"], "tiers")
        progress.update(steps, runner.results)

    next_eval = plan.eval_every or None
    try:
        while not stop.is_set() and not _done(plan, clock, steps) and not watcher.done():
            await _while_bus_is_up(feeder.top_up())
            collect()
            version = steps[-1]["version"] if steps else 0
            if next_eval is not None and version >= next_eval and not runner.busy:
                if await _while_bus_is_up(runner.submit(clock.elapsed())):
                    next_eval = version + plan.eval_every
            await asyncio.sleep(0.5)
        progress.close()
        if not stop.is_set() and not watcher.done():
            await _final_evaluation(runner, clock, collect)
    finally:
        stop.set()
        await watcher
        scalars.close()
        last_stats.write(plan.run_dir / "stats.json")
    return Outcome(steps=steps, heldout=runner.results, started_at=clock.started_at)


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
    return clock.elapsed() >= plan.minutes * 60


async def _final_evaluation(runner: HeldoutRunner, clock: _Clock, collect: Any) -> None:
    """Evaluate the last version once the evaluation in flight (if any) is in."""
    say("training is done: final held-out evaluation")
    await runner.drain(_FINAL_EVAL_S)
    await runner.submit(clock.elapsed())
    deadline = time.monotonic() + _FINAL_EVAL_S
    while runner.busy and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        collect()
    if runner.busy:
        say(f"the final held-out evaluation did not finish in {_FINAL_EVAL_S:.0f} s")


class _Clock:
    def __init__(self) -> None:
        self._start = time.monotonic()
        self.started_at = time.time()

    def elapsed(self) -> float:
        return time.monotonic() - self._start


class Feeder:
    """Keeps ``in_flight`` tasks of the domain outstanding; a task is done once scored."""

    def __init__(self, nc: NATS, plan: TrainPlan) -> None:
        from services.domains import load_registry

        self._nc = nc
        self._plan = plan
        self._domain = load_registry(None).get(plan.domain)
        self._scored: dict[str, int] = {}
        #: Task id -> when it was submitted; forgotten once scored or after ``_GIVE_UP_S``.
        self._open: dict[str, float] = {}
        self._round = 0

    async def start(self) -> None:
        await self._nc.subscribe(subjects.scored_all(), cb=self._on_scored)

    async def _on_scored(self, msg: Msg) -> None:
        # The task id is the subject's last token: no need to decode the whole rollout.
        task_id = msg.subject.rsplit(".", 1)[-1]
        count = self._scored.get(task_id, 0) + 1
        self._scored[task_id] = count
        if count >= self._plan.group:
            self._open.pop(task_id, None)
            self._scored.pop(task_id, None)

    async def top_up(self) -> None:
        # A task that never completes (a sample dead-lettered) must not stall the feed.
        now = time.monotonic()
        for task_id, sent in list(self._open.items()):
            if now - sent > _GIVE_UP_S:
                del self._open[task_id]
        missing = self._plan.in_flight - len(self._open)
        if missing <= 0:
            return
        js = self._nc.jetstream()
        for task in self._tasks(missing):
            await js.publish(
                subjects.of_task(task),
                encode(task),
                headers={"Nats-Msg-Id": task.id},
            )
            self._open[task.id] = time.monotonic()

    def _tasks(self, count: int) -> Iterator[Task]:
        self._round += 1
        seed = int(time.time()) * 1000 + self._round
        for task in self._domain.make_tasks(count, split="train", seed=seed):
            fields = {f: getattr(task, f) for f in task.__struct_fields__ if f != "v"}
            fields["n"] = self._plan.group
            yield Task(**fields)


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
