"""``temper train``: the embedded stack trains the tiny policy on a domain and shows it learning.

One command runs everything on this machine: nats-server, generator (torch engine),
validator, replay and learner, plus a feeder that keeps tasks of the domain flowing.
It prints the learner's reward per step as it goes and, at the end, the reward of the
first steps against the last ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from protocol import subjects
from protocol.codec import encode
from protocol.messages import Task
from services.cli.common import CliError, connect, run, stop_event
from services.runtime.natsserver import NatsServerError
from services.supervisor import StackSettings, Supervisor

SERVICES = ("control", "generator", "validator", "replay", "learner")
_GIVE_UP_S = 300.0


def register(commands: Any) -> None:
    train = commands.add_parser(
        "train", help="train the tiny policy on the embedded stack and show the reward rising"
    )
    train.add_argument("--run-dir", type=Path, default=Path("run/train"))
    train.add_argument("--nats-port", type=int, default=4223)
    train.add_argument("--domain", default="arithmetic")
    train.add_argument("--minutes", type=float, default=10.0, help="stop after this long")
    train.add_argument("--group", type=int, default=8, help="samples per task (GRPO group)")
    train.add_argument("--in-flight", type=int, default=48, help="tasks kept outstanding")
    train.add_argument("--batch", type=int, default=128, help="samples per learner step")
    train.add_argument("--lr", type=float, default=5e-4)
    train.add_argument("--warmup-steps", type=int, default=40, help="supervised warm-up steps")
    train.add_argument("--fresh", action="store_true", help="start over (delete RUN_DIR)")
    train.set_defaults(run=cmd_train)


@dataclass(frozen=True, kw_only=True)
class TrainPlan:
    run_dir: Path
    nats_port: int
    domain: str
    minutes: float
    group: int
    in_flight: int
    batch: int
    lr: float
    warmup_steps: int


def cmd_train(args: argparse.Namespace) -> int:
    plan = TrainPlan(
        run_dir=args.run_dir.resolve(),
        nats_port=args.nats_port,
        domain=args.domain,
        minutes=args.minutes,
        group=args.group,
        in_flight=args.in_flight,
        batch=args.batch,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
    )
    if args.fresh:
        import shutil

        shutil.rmtree(plan.run_dir, ignore_errors=True)
    model = prepare_policy(plan)
    try:
        return run(lambda: _train(plan, model))
    except NatsServerError as error:
        raise CliError(str(error)) from None


def prepare_policy(plan: TrainPlan) -> Path:
    """The tiny policy, warmed up once; a later run continues from the learner's checkpoint."""
    from services.domains import UnknownDomain, load_registry
    from services.generator.model import init_model
    from services.learner.warmup import WarmupConfig, supervised_warmup

    try:
        domain = load_registry(None).get(plan.domain)
    except UnknownDomain as error:
        raise CliError(str(error), 2) from None
    model = plan.run_dir / "model"
    if (model / "config.json").is_file():
        return model
    _say(f"building the tiny policy in {model}")
    init_model(model, force=True)
    if plan.warmup_steps:
        _say(f"supervised warm-up: {plan.warmup_steps} steps on {plan.domain}'s train split")
        loss = supervised_warmup(model, domain, WarmupConfig(steps=plan.warmup_steps))
        _say(f"warm-up done (loss {loss:.3f}); reinforcement learning from here")
    return model


async def _train(plan: TrainPlan, model: Path) -> int:
    stop = stop_event()
    supervisor = Supervisor(_stack(plan, model), say=_say)
    try:
        await supervisor.start()
        nc = await connect(supervisor.nats_url, "temper-train")
        try:
            steps = await _run_until_done(plan, nc, supervisor, stop)
        finally:
            await nc.close()
    finally:
        await supervisor.stop()
    _summary(steps)
    return 0


def _stack(plan: TrainPlan, model: Path) -> StackSettings:
    env = {
        "TEMPER_GENERATOR_MODEL": str(model),
        "TEMPER_GENERATOR_TOOLS": "local",
        "TEMPER_GENERATOR_MAX_CONCURRENT_TASKS": "8",
        "TEMPER_LEARNER_MODEL": str(model),
        "TEMPER_LEARNER_OUT_DIR": str(plan.run_dir / "learner"),
        "TEMPER_LEARNER_BATCH_SIZE": str(plan.batch),
        "TEMPER_LEARNER_MIN_SAMPLES": str(max(plan.group * 2, plan.batch // 2)),
        "TEMPER_LEARNER_MICRO_BATCH": "64",
        "TEMPER_LEARNER_LR": str(plan.lr),
        "TEMPER_STATS_S": "2",
    }
    return StackSettings(run_dir=plan.run_dir, nats_port=plan.nats_port, services=SERVICES, env=env)


async def _run_until_done(
    plan: TrainPlan, nc: NATS, supervisor: Supervisor, stop: asyncio.Event
) -> list[dict[str, Any]]:
    feeder = Feeder(nc, plan)
    await feeder.start()
    deadline = time.monotonic() + plan.minutes * 60
    metrics = MetricsTail(plan.run_dir / "learner" / "metrics.jsonl")
    seen: list[dict[str, Any]] = []
    watcher = asyncio.ensure_future(supervisor.watch(stop))
    try:
        while not stop.is_set() and time.monotonic() < deadline and not watcher.done():
            await feeder.top_up()
            for line in metrics.new_lines():
                seen.append(line)
                _report(line, seen)
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await watcher
    return seen


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
                subjects.task(task.tier, task.domain),
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


def _report(line: dict[str, Any], seen: list[dict[str, Any]]) -> None:
    recent = [s["reward_mean"] for s in seen[-10:]]
    _say(
        f"step {line['step']:>4}  version {line['version']:>4}  "
        f"reward {line['reward_mean']:.3f}  (mean of last {len(recent)}: "
        f"{statistics.fmean(recent):.3f})  staleness {line['staleness_mean']:.2f}"
    )


def _summary(steps: list[dict[str, Any]]) -> None:
    if len(steps) < 4:
        _say(f"{len(steps)} learner steps: too few to compare (run longer with --minutes)")
        return
    window = max(2, min(10, len(steps) // 3))
    first = statistics.fmean(s["reward_mean"] for s in steps[:window])
    last = statistics.fmean(s["reward_mean"] for s in steps[-window:])
    _say(
        f"{len(steps)} learner steps: mean reward of the first {window} {first:.3f}, "
        f"of the last {window} {last:.3f} ({last - first:+.3f})"
    )


def _say(line: str) -> None:
    print(f"[temper {time.strftime('%H:%M:%S')}] {line}", flush=True)
