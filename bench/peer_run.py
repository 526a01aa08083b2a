"""Temper side by side with Hugging Face TRL: what the end-to-end benchmarks share.

``bench_e2e.py`` (one domain) and ``bench_mix.py`` (a run config's mix of domains) each
build Temper's start policy once (``temper train --warmup-only``), train it with TRL's
``GRPOTrainer`` (deploy/peers/trl, in its own venv) and then with Temper's embedded stack
(``temper train``) for the same wall-clock budget, one after the other so that neither
takes CPU from the other, and print both (``peer_report.py``): trained samples/s, train
reward, held-out greedy accuracy against time, where Temper's CPU went, and the goals.

Held-out answers are judged the same way on both sides: TRL's snapshots are decoded
greedily here (``services.model.greedy``) and each answer is judged by its domain's own
validators, as Temper's held-out evaluation judges the answers its stack generates.
A curve over several domains is their macro average (each domain counting the same), the
figure of Temper's ``eval/heldout_macro.jsonl``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import children
from stack_figures import learner_stages, learner_steps

from protocol.messages import Rollout, ScoreStatus, Task
from services.cli.runconfig import RunDomains, TrainPlan, add_flags, load_domains, plan_of
from services.domains import Domain, Problem
from services.evaluation.heldout import HeldoutSet
from services.feeder.dataset import Dataset
from services.feeder.settings import FeederSettings
from services.model.greedy import greedy_texts
from services.model.load import load_causal_lm
from services.model.tokens import ChatTokenizer
from services.validator.compose import Panel, build_panel
from services.validator.factory import Resources

ROOT = Path(__file__).resolve().parents[1]
TEMPER = [str(ROOT / ".venv" / "bin" / "temper")]
TRL_PEER = ROOT / "deploy" / "peers" / "trl"
#: Temper's learner rate falls linearly to this fraction of ``lr`` (its default); TRL's too.
LR_FINAL = 0.1
#: Seconds of TRL's training clock between its snapshots (each scored afterwards).
SNAPSHOT_EVERY_S = 60.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")
#: What a run directory keeps of an earlier run: none of it, or the learner would resume
#: its checkpoint and the feeder its cursor.  The model goes too: the warm-up is cached
#: per recipe, so a changed mix gets its own start policy back in a copy.
_STALE = ("model", "learner", "feeder", "eval", "tensorboard", "nats", "logs", "stats.json")


@dataclass(frozen=True, kw_only=True)
class Side:
    name: str
    #: Optimizer steps, and the batches of samples they were taken on.
    steps: int
    batches: int
    samples: int
    seconds: float
    #: Mean train reward of each batch.
    rewards: list[float]
    #: (seconds since training started, held-out greedy accuracy by domain)
    heldout: list[tuple[float, dict[str, float]]]

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def curve(self) -> list[tuple[float, float]]:
        """Held-out greedy accuracy, macro-averaged over domains, against time."""
        return [(at, statistics.fmean(by.values())) for at, by in self.heldout]


@dataclass(frozen=True, kw_only=True)
class Matched:
    """The settings both sides train with: Temper's learner's, given to TRL in its spec."""

    group: int
    batch: int
    minibatches: int
    lr: float
    lr_decay_steps: int
    #: TRL has one completion cap for every domain.
    max_new_tokens: int

    def trl_spec(
        self, model: Path, train: list[dict[str, Any]], minutes: float, threads: int
    ) -> dict[str, Any]:
        return {
            "model_dir": str(model),
            "train": train,
            "group": self.group,
            "samples_per_step": self.batch,
            "minibatches": self.minibatches,
            "lr": self.lr,
            "lr_decay_steps": self.lr_decay_steps,
            "lr_final": LR_FINAL,
            "max_new_tokens": self.max_new_tokens,
            "temperature": 1.0,
            # Temper's learner leaves samples cut at max_tokens out of the loss.
            "mask_truncated_completions": True,
            "minutes": minutes,
            "snapshot_every_s": SNAPSHOT_EVERY_S,
            "threads": threads,
        }

    def describe(self) -> str:
        return (
            f"group {self.group}; {self.batch} samples per batch in {self.minibatches} "
            f"optimizer steps; lr {self.lr:g} falling linearly to {LR_FINAL:g}x over "
            f"{self.lr_decay_steps} batches; temperature 1; float32; no KL; completions cut "
            "at the token limit left out of the loss"
        )


@dataclass(frozen=True, kw_only=True)
class Mix:
    """What ``temper train FLAGS`` trains, read by Temper's own run-config code."""

    flags: tuple[str, ...]
    plan: TrainPlan
    domains: RunDomains
    settings: Matched


def read_mix(flags: Sequence[str], folder: Path) -> Mix:
    """The plan and domains ``temper train FLAGS`` would run (their combined domains config
    written to ``folder``), and the settings TRL gets from them."""
    parser = argparse.ArgumentParser(prog="temper train")
    add_flags(parser)
    plan = plan_of(parser.parse_args(list(flags)))
    domains = load_domains(plan, folder)
    settings = Matched(
        group=plan.group,
        batch=plan.batch,
        minibatches=plan.minibatches,
        lr=plan.lr,
        lr_decay_steps=plan.lr_decay_steps,
        max_new_tokens=max(domain.max_tokens for domain, _ in domains.train),
    )
    return Mix(flags=tuple(flags), plan=plan, domains=domains, settings=settings)


def feeder_rows(domain: Domain, seed: int, count: int) -> list[dict[str, Any]]:
    """``count`` rows of TRL's dataset: the problems Temper's feeder asks for ``domain``,
    epoch after epoch of its dataset for the run's seed, each in the spelling that epoch
    asks it in.  Both sides train on the same problems written the same ways."""
    dataset = Dataset.of(domain, FeederSettings().dataset_size, seed)
    asked = (
        dataset.spelling(index, epoch)
        for epoch in itertools.count()
        for index in dataset.order(epoch)
    )
    return [trl_row(domain, problem) for problem in itertools.islice(asked, count)]


def trl_row(domain: Domain, problem: Problem) -> dict[str, Any]:
    """A problem as a row of TRL's dataset: the prompt Temper's generator renders, and the
    answer the reward rule checks."""
    messages = domain.prompt.messages(problem.question)
    return {
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "answer": str(problem.metadata["answer"]),
    }


# ------------------------------------------------------------------ the two runs


@dataclass(frozen=True, kw_only=True)
class Comparison:
    #: What TRL's runner got.
    spec: dict[str, Any]
    trl: Side
    temper: Side
    #: Temper's CPU seconds by process, and its learner's seconds per stage.
    cpu: dict[str, float]
    stages: dict[str, float]
    run_dir: Path


class Scorer(Protocol):
    def accuracy(self, model_dir: Path) -> dict[str, float]:
        """Held-out greedy accuracy of a model directory, by domain."""
        ...


def compare(
    out: Path,
    mix: Mix,
    rows: list[dict[str, Any]],
    minutes: float,
    threads: int,
    scorer: Scorer | None = None,
    **spec: Any,
) -> Comparison:
    """TRL on ``rows`` (its spec completed by ``spec``), then Temper's stack on ``mix``,
    from the same start policy for ``minutes`` each; TRL's snapshots scored by ``scorer``
    (default: decoded here on the eval domains' held-out problems, as many as Temper's
    evaluation takes)."""
    children.exit_on_term()
    run = out / "temper"
    model = prepare(run, mix.flags)
    full = {**mix.settings.trl_spec(model, rows, minutes, threads), **spec}
    if scorer is None:
        limit = mix.plan.eval_problems
        scorer = HeldoutScorer([HeldoutSet.of(d, limit=limit) for d in mix.domains.eval])
    trl = trl_side(run_trl(out / "trl", full), scorer, mix.settings.minibatches)
    cpu = run_temper(
        [*TEMPER, "train", *mix.flags, "--run-dir", str(run), "--minutes", str(minutes)]
    )
    temper, stages = temper_side(run, minutes)
    return Comparison(spec=full, trl=trl, temper=temper, cpu=cpu, stages=stages, run_dir=run)


def prepare(run: Path, config: Sequence[str]) -> Path:
    """The shared start policy, in ``run/model``: ``temper train CONFIG --warmup-only``."""
    for stale in _STALE:
        path = run / stale
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    command = [*TEMPER, "train", *config, "--run-dir", str(run), "--warmup-only"]
    children.run(command)
    return run / "model"


@dataclass(frozen=True, kw_only=True)
class TrlRun:
    summary: dict[str, Any]
    steps: list[dict[str, Any]]
    #: (seconds of TRL's training clock, model directory), in time order.
    snapshots: list[tuple[float, Path]]


def run_trl(work: Path, spec: dict[str, Any]) -> TrlRun:
    """TRL's runner on ``spec`` in its venv (built on first use), its outputs in ``work``."""
    built = children.run([str(TRL_PEER / "build.sh")], stdout=subprocess.PIPE, text=True)
    python = built.split()[-1]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "spec.json").write_text(json.dumps(spec))
    out = work / "out"
    runner = TRL_PEER / "grpo_run.py"
    children.run([python, str(runner), str(work / "spec.json"), str(out)])
    lines = (out / "steps.jsonl").read_text().splitlines()
    snapshots = sorted((float(path.name[1:]), path) for path in (out / "snapshots").iterdir())
    return TrlRun(
        summary=json.loads((out / "summary.json").read_text()),
        steps=[json.loads(line) for line in lines if line.strip()],
        snapshots=snapshots,
    )


def trl_side(run: TrlRun, scorer: Scorer, minibatches: int) -> Side:
    steps = int(run.summary["steps"])
    return Side(
        name="trl",
        steps=steps,
        batches=-(-steps // minibatches),
        samples=int(run.summary["samples"]),
        seconds=float(run.summary["train_seconds"]),
        # A batch's optimizer steps all log the reward of its samples: one per batch.
        rewards=[float(s["reward_mean"]) for s in run.steps[::minibatches]],
        heldout=[(at, scorer.accuracy(path)) for at, path in run.snapshots],
    )


def run_temper(command: list[str]) -> dict[str, float]:
    """Run ``temper train``, its output shown as it comes; CPU seconds by process."""
    cpu: dict[int, tuple[str, float]] = {}
    with (
        subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc,
        children.stopped_on_exit(proc),
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            found = re.search(r"\] (\S+) +started \(pid (\d+)", line)
            if found:
                cpu[int(found.group(2))] = (found.group(1), 0.0)
            _sample_cpu(cpu)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, command)
    return {f"{name} (pid {pid})": used for pid, (name, used) in cpu.items()}


def _sample_cpu(cpu: dict[int, tuple[str, float]]) -> None:
    """CPU seconds (user + system) each service has used so far, read while it runs."""
    for pid, (name, _) in list(cpu.items()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[pid] = (name, (int(fields[11]) + int(fields[12])) / _CLK_TCK)


def temper_side(run: Path, minutes: float) -> tuple[Side, dict[str, float]]:
    """Temper's figures from its run directory, and its learner's stages."""
    steps = learner_steps(run)
    side = Side(
        name="temper",
        steps=sum(int(s.get("updates", 1)) for s in steps),
        batches=len(steps),
        samples=sum(int(s["samples"]) for s in steps),
        seconds=minutes * 60,
        rewards=[float(s["reward_mean"]) for s in steps],
        heldout=temper_heldout(run),
    )
    return side, learner_stages(steps)


def temper_heldout(run: Path) -> list[tuple[float, dict[str, float]]]:
    """Each evaluation of ``eval/heldout.jsonl``: its time and greedy accuracy by domain."""
    rounds: dict[int, tuple[float, dict[str, float]]] = {}
    for text in (run / "eval" / "heldout.jsonl").read_text().splitlines():
        if not text.strip():
            continue
        line = json.loads(text)
        _, by_domain = rounds.setdefault(int(line["evaluation"]), (float(line["elapsed_s"]), {}))
        by_domain[str(line["domain"])] = float(line["greedy_accuracy"])
    return [rounds[number] for number in sorted(rounds)]


# ------------------------------------------------------------------ held-out scoring


class HeldoutScorer:
    """Greedy held-out accuracy of a model directory, each answer judged by its domain's
    validators (a greedy answer passes when its reward reaches the domain's threshold)."""

    def __init__(self, sets: Sequence[HeldoutSet]) -> None:
        self.sets = tuple(sets)
        self.panels: dict[str, Panel] = {
            s.domain.name: build_panel(s.domain, Resources(), 30.0, {}) for s in self.sets
        }

    def accuracy(self, model_dir: Path) -> dict[str, float]:
        tokenizer = ChatTokenizer.load(model_dir)
        model = load_causal_lm(model_dir)
        return {s.domain.name: self._accuracy(model, tokenizer, s) for s in self.sets}

    def _accuracy(self, model: Any, tokenizer: ChatTokenizer, heldout: HeldoutSet) -> float:
        domain = heldout.domain
        prompts = [tokenizer.render(domain.prompt.messages(p.question)) for p in heldout.problems]
        texts = greedy_texts(model, tokenizer, prompts, domain.max_tokens)
        passed = [
            self.passes(domain, domain.task(problem, "eval", 0, index), text)
            for index, (problem, text) in enumerate(zip(heldout.problems, texts, strict=True))
        ]
        return sum(passed) / len(passed)

    def passes(self, domain: Domain, task: Task, text: str) -> bool:
        rollout = Rollout(id=f"{task.id}/0", task=task, sample_index=0, completion_text=text)
        judgement = self.panels[domain.name].judge_now(rollout)
        return judgement.status is ScoreStatus.SCORED and judgement.reward >= domain.pass_threshold
