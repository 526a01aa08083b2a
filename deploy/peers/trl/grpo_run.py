"""Train a local model with Hugging Face TRL's GRPOTrainer on CPU for a wall-clock budget.

    python grpo_run.py SPEC.json OUT_DIR

Runs inside the venv that deploy/peers/trl/build.sh makes, so it imports only the standard
library, TRL's stack and grpo_spec.py beside it (the spec's checks and the reward rules),
never Temper.  See README.md here for the SPEC fields and outputs:

    OUT_DIR/steps.jsonl            one line per optimizer step
    OUT_DIR/snapshots/tNNNNN.N/    model + tokenizer at training-clock times (safetensors)
    OUT_DIR/summary.json           totals and versions

The training clock starts when TRL's training loop starts (model load excluded) and does not
run while a snapshot is being written, so snapshots cost TRL no training time.
"""

from __future__ import annotations

import os

# No hub access, ever: set before any Hugging Face module is imported.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_var] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TextIO  # noqa: E402

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from grpo_spec import NO_DOMAIN, Spec, SpecError, completion_text, load_spec, route  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from trl import GRPOConfig, GRPOTrainer  # noqa: E402


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- reward -------------------------------------------------------------------------------

RewardFunc = Callable[..., list[float | None]]


def answer_reward_of(spec: Spec) -> RewardFunc:
    """TRL's reward function: each completion scored by the rule of its row's domain."""
    scorers = spec.scorers()

    def answer_reward(
        completions: list[Any], answer: list[str], domain: list[str], **_: Any
    ) -> list[float | None]:
        # TRL passes each extra dataset column ("answer", "domain") as a keyword list aligned
        # with the completions.  The return type is TRL's (None: no reward for this sample).
        texts = [completion_text(c) for c in completions]
        return list(route(scorers, texts, answer, domain))

    return answer_reward


# --- training clock, snapshots and step log -----------------------------------------------


#: Figures TRL logs once per generation batch (with the batch's first optimizer step).
_BATCH_METRICS = ("reward", "completions/mean_length")


class BudgetCallback(TrainerCallback):
    """Stops training after the budget, snapshots on a timer and logs each optimizer step."""

    def __init__(
        self, spec: Spec, out_dir: Path, tokenizer: PreTrainedTokenizerBase, steps: TextIO
    ) -> None:
        self.spec = spec
        self.budget_s = spec.minutes * 60.0
        self.snapshots = out_dir / "snapshots"
        self.tokenizer = tokenizer
        self.steps = steps
        self.start = 0.0
        self.paused = 0.0  # seconds spent writing snapshots, not counted as training
        self.next_snapshot = 0.0
        self.step_elapsed = 0.0  # training clock at the end of the latest optimizer step
        self.snapshot_step = -1  # global step of the latest snapshot
        self.batch_metrics: dict[str, float] = {}  # of the latest generation batch

    def elapsed(self) -> float:
        return time.monotonic() - self.start - self.paused

    def snapshot(self, model: PreTrainedModel, step: int, at_s: float) -> None:
        began = time.monotonic()
        target = self.snapshots / f"t{at_s:07.1f}"
        model.save_pretrained(target)  # transformers 5 always writes safetensors
        self.tokenizer.save_pretrained(target)
        self.snapshot_step = step
        self.next_snapshot = (at_s // self.spec.snapshot_every_s + 1) * self.spec.snapshot_every_s
        self.paused += time.monotonic() - began

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.start = time.monotonic()
        self.snapshot(kw["model"], 0, 0.0)
        if self.spec.lr_decay_steps:
            # The "constant" scheduler is a LambdaLR: its factor per optimizer step becomes
            # the decay (which falls once per generation batch: Spec.lr_factor).
            scheduler = kw["lr_scheduler"]
            scheduler.lr_lambdas = [self.spec.lr_factor] * len(scheduler.lr_lambdas)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        # Called once per optimizer step, before the step's log; the check can only happen
        # between steps, so the last step may run past the budget by up to one step.
        self.step_elapsed = self.elapsed()
        if self.step_elapsed >= self.next_snapshot:
            self.snapshot(kw["model"], state.global_step, self.step_elapsed)
        if self.step_elapsed >= self.budget_s:
            control.should_training_stop = True

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        if not logs or "loss" not in logs:
            return  # the end-of-training summary log carries no step metrics
        # TRL logs the generation metrics (reward, lengths) with the first optimizer step of
        # each generation batch; the batch's other steps train on the same samples.
        self.batch_metrics.update({k: logs[k] for k in _BATCH_METRICS if k in logs})
        row = {
            "step": state.global_step,
            "elapsed_s": round(self.step_elapsed, 3),
            "samples": self.spec.samples_per_update,
            "reward_mean": self.batch_metrics.get("reward"),
            # Not required by the step contract; kept so tokens/s can be compared too.
            "completion_len_mean": self.batch_metrics.get("completions/mean_length"),
        }
        self.steps.write(json.dumps(row) + "\n")
        self.steps.flush()
        log(
            f"trl step {row['step']} t={row['elapsed_s']:.1f}s "
            f"reward={self.batch_metrics.get('reward', float('nan')):.3f} "
            f"len={self.batch_metrics.get('completions/mean_length', float('nan')):.1f} "
            f"loss={logs['loss']:.4f}"
        )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        # The final model, named by the clock at its last step, unless that step already has one.
        if state.global_step != self.snapshot_step:
            self.snapshot(kw["model"], state.global_step, self.step_elapsed)


# --- setup --------------------------------------------------------------------------------


def grpo_config(spec: Spec, out_dir: Path) -> GRPOConfig:
    # One generation batch = samples_per_step completions, trained on in `minibatches`
    # optimizer steps, each completion exactly once:
    # - per_device_train_batch_size counts completions (not prompts) per forward/backward;
    # - gradient_accumulation_steps micro-batches make one optimizer step of
    #   samples_per_step / minibatches completions;
    # - steps_per_generation counts micro-batches per generation batch: with
    #   minibatches x gradient_accumulation_steps of them, TRL's generation batch
    #   (per_device_train_batch_size * steps_per_generation, one process) is samples_per_step,
    #   i.e. samples_per_step / group prompts x group completions, generated once, shuffled
    #   and split into the micro-batches of `minibatches` optimizer steps;
    # - num_iterations=1: no generation batch is used twice.  With one minibatch the step is
    #   fully on-policy (TRL skips the old log-probs); with more, TRL computes the generating
    #   policy's log-probs once per batch and clips the later steps' ratio against them, as
    #   Temper's learner clips its minibatches against the batch's start.
    steps_per_generation = spec.minibatches * spec.accumulation
    return GRPOConfig(
        output_dir=str(out_dir / "trainer"),
        per_device_train_batch_size=spec.micro,
        gradient_accumulation_steps=spec.accumulation,
        steps_per_generation=steps_per_generation,
        num_generations=spec.group,
        num_iterations=1,
        max_completion_length=spec.max_new_tokens,
        mask_truncated_completions=spec.mask_truncated_completions,
        temperature=spec.temperature,
        learning_rate=spec.lr,
        # max_steps is a placeholder, so no built-in decay: the callback sets the schedule.
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=1_000_000,  # the budget callback stops training
        beta=0.0,  # no KL term, so no reference model
        bf16=False,
        fp16=False,
        use_cpu=True,
        # TRL defaults this to True; on a small model on CPU it only costs recomputation.
        gradient_checkpointing=False,
        seed=spec.seed,
        report_to="none",
        logging_strategy="steps",
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,  # one line per step of our own instead
        dataloader_num_workers=0,
    )


def load_model(model_dir: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model, tokenizer


def train_dataset(spec: Spec) -> Dataset:
    # Conversational prompts: TRL applies the tokenizer's chat template with a generation prompt.
    rows = [
        {"prompt": r["messages"], "answer": r["answer"], "domain": r.get("domain", NO_DOMAIN)}
        for r in spec.train
    ]
    return Dataset.from_list(rows)


def write_summary(out_dir: Path, spec: Spec, steps: int, train_seconds: float) -> dict[str, Any]:
    samples = steps * spec.samples_per_update
    summary = {
        "steps": steps,
        "samples": samples,
        "train_seconds": round(train_seconds, 3),
        "samples_per_s": round(samples / train_seconds, 4) if train_seconds > 0 else 0.0,
        "trl_version": trl.__version__,
        "torch_version": torch.__version__,
        "threads": spec.threads,
        "minibatches": spec.minibatches,
        "mask_truncated_completions": spec.mask_truncated_completions,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        log("usage: grpo_run.py SPEC.json OUT_DIR")
        return 2
    try:
        spec = load_spec(Path(argv[0]))
    except SpecError as error:
        log(f"grpo_run: {error}")
        return 2
    out_dir = Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(spec.threads)

    model, tokenizer = load_model(spec.model_dir)
    with (out_dir / "steps.jsonl").open("w") as steps:
        callback = BudgetCallback(spec, out_dir, tokenizer, steps)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=answer_reward_of(spec),
            args=grpo_config(spec, out_dir),
            train_dataset=train_dataset(spec),
            processing_class=tokenizer,
            callbacks=[callback],
        )
        trainer.train()
    summary = write_summary(out_dir, spec, trainer.state.global_step, callback.step_elapsed)
    log(f"trl done: {json.dumps(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
