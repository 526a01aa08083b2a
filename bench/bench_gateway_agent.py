"""An OpenAI agent trained through the gateway: its reward against wall clock, with and
without the rewards reaching the learner, side by side in one run.

``examples/openai_agent.py`` (the official ``openai`` client, a local python tool,
several turns) answers modular powers through Temper's gateway, each problem one session
of ``--attempts`` conversations.  Every problem is new when the agent meets it, so each
reward is measured on a problem never trained on.  The stack (``temper up``: generator,
replay buffer, learner, gateway) starts from the same policy twice:

- **control**: the agent posts no reward, so the learner never steps and the policy
  stays as it started: what the start policy scores, with its noise;
- **trained**: the agent posts its rewards, which close each session into scored
  rollouts the learner trains on while the agent goes on.

Printed for both: problems solved, mean reward per window of problems, learner steps,
and the ratio of the trained run's last window to the control's mean; the curves go to
a PNG (``--plot``).  Figures are printed, never asserted.

    python bench/bench_gateway_agent.py --minutes 6 --plot docs/img/gateway_agent.png
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gateway_stack import KEY, TEMPER, GatewayStack  # noqa: E402


def load_agent() -> ModuleType:
    path = ROOT / "examples" / "openai_agent.py"
    spec = importlib.util.spec_from_file_location("openai_agent", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def warmed_up(run: Path) -> Path:
    """The tool domain's start policy (``temper train --warmup-only``): it calls the python
    tool in the model's format, and answers about a third of the problems sampled."""
    config = ROOT / "deploy" / "runs" / "tools.toml"
    command = [str(TEMPER), "train", "--config", str(config), "--run-dir", str(run)]
    subprocess.run([*command, "--warmup-only"], check=True)
    return run / "model"


@dataclass
class Run:
    name: str
    rewards: list[float] = field(default_factory=list)
    elapsed: list[float] = field(default_factory=list)
    steps: int = 0

    def windows(self, size: int) -> list[float]:
        chunks = [self.rewards[i : i + size] for i in range(0, len(self.rewards), size)]
        return [statistics.fmean(c) for c in chunks if len(c) == size]


def stack_for(model: Path, args: argparse.Namespace) -> GatewayStack:
    """The services an agent trains through, from a copy of ``model``."""
    env = {
        "TEMPER_GATEWAY_MAX_TOKENS": str(args.max_tokens),
        "TEMPER_LEARNER_BATCH_SIZE": str(args.batch),
        "TEMPER_LEARNER_MIN_SAMPLES": str(args.batch),
        "TEMPER_LEARNER_LR": str(args.lr),
        "TEMPER_LEARNER_MAX_STALENESS": "4",
    }
    services = ("generator", "replay", "learner", "gateway", "control")
    return GatewayStack("gateway-agent-", services, env, lambda path: shutil.copytree(model, path))


async def drive(stack: GatewayStack, run: Run, args: argparse.Namespace, *, reward: bool) -> None:
    """The agent on new problems until the clock runs out."""
    from openai import AsyncOpenAI

    agent = load_agent()
    started = time.monotonic()
    index = 0
    while time.monotonic() - started < args.minutes * 60:
        [problem] = agent.problems(1, seed=args.seed * 100_003 + index)
        session = f"{run.name}-{index}"
        async with AsyncOpenAI(
            base_url=stack.url,
            api_key=KEY,
            default_headers={"X-Temper-Session": session},
            max_retries=0,
            timeout=120,
        ) as client:
            outcome = await agent.solve(
                client,
                "temper-policy",
                problem,
                attempts=args.attempts,
                max_turns=args.max_turns,
                stream=False,
            )
            if reward:
                await agent.reward(client, session, outcome.rewards)
        run.rewards.append(statistics.fmean(outcome.rewards))
        run.elapsed.append(time.monotonic() - started)
        index += 1
    run.steps = stack.version()


def one_run(name: str, args: argparse.Namespace, *, reward: bool) -> Run:
    run = Run(name)
    stack = stack_for(args.model, args)
    try:
        stack.wait_ready()
        asyncio.run(drive(stack, run, args, reward=reward))
    finally:
        stack.stop()
    return run


def report(runs: list[Run], window: int) -> None:
    control, trained = runs
    base = statistics.fmean(control.rewards) if control.rewards else 0.0
    for run in runs:
        windows = run.windows(window)
        shown = ", ".join(f"{w:.2f}" for w in windows)
        print(
            f"{run.name:8} {len(run.rewards)} problems, {run.steps} learner steps, "
            f"mean reward {statistics.fmean(run.rewards):.3f}; per {window} problems: {shown}"
        )
    last = trained.windows(window)[-1:] or [0.0]
    ratio = last[0] / base if base else float("inf")
    print(f"trained last window / control mean: {last[0]:.3f} / {base:.3f} = {ratio:.2f}x")


def plot(runs: list[Run], window: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for run in runs:
        means = [
            statistics.fmean(run.rewards[max(0, i - window + 1) : i + 1])
            for i in range(len(run.rewards))
        ]
        minutes = [t / 60 for t in run.elapsed]
        axes.plot(minutes, means, label=f"{run.name} ({run.steps} learner steps)")
    axes.set_xlabel("minutes")
    axes.set_ylabel(f"agent reward (mean of the last {window} problems)")
    axes.set_title("examples/openai_agent.py through the gateway, new problems only")
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="start policy directory (default: deploy/runs/tools.toml's warm-up, cached)",
    )
    parser.add_argument("--minutes", type=float, default=8.0, help="per run")
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=32, help="learner samples per step")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--window", type=int, default=25, help="problems per window")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.model is None:
        args.model = warmed_up(Path(tempfile.mkdtemp(prefix="gateway-agent-start-")))
    runs = [one_run("control", args, reward=False), one_run("trained", args, reward=True)]
    report(runs, args.window)
    if args.plot is not None:
        plot(runs, args.window, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
