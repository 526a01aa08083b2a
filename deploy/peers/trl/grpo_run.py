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
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TextIO  # noqa: E402

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from grpo_spec import (  # noqa: E402
    NO_DOMAIN,
    TOOL_CHAT_TEMPLATE,
    Spec,
    SpecError,
    completion_text,
    load_spec,
    route,
    tool_output,
)
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


# --- tools --------------------------------------------------------------------------------

#: How TRL reads a turn's tool calls from the model's text (transformers' response template):
#: ``<tool_call>{json}</tool_call>`` blocks after the turn's text, as Qwen3's template has it.
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


#: Seconds of the training clock by what they went to (the rest of it is training).
Seconds = dict[str, float]


def python_tool(timeout_s: float, scratch: Path, seconds: Seconds) -> Callable[[str], str]:
    """The ``python`` tool: the code in a fresh interpreter (a subprocess in a scratch
    folder) with the domain's timeout, returning what it prints, stderr after stdout, as
    Temper's sandboxed ``python`` returns it.  Its time is added to ``seconds["tools"]``."""

    def python(code: str) -> str:
        """Run Python code and return what it prints.

        Args:
            code: The Python program to run.
        """
        began = time.monotonic()
        try:
            return _run_python(code, timeout_s, scratch)
        finally:
            seconds["tools"] = seconds.get("tools", 0.0) + time.monotonic() - began

    return python


def _run_python(code: str, timeout_s: float, scratch: Path) -> str:
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=scratch,
        )
    except subprocess.TimeoutExpired as error:
        printed = error.stdout.decode() if isinstance(error.stdout, bytes) else error.stdout
        return f"{printed or ''}\ntimed out after {timeout_s:g} s"
    return tool_output(done.stdout, done.stderr)


def use_tool_format(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Tool calls written and read as Temper's agent loop does: a turn ends at its call
    (``</tool_call>`` stops generation, as in Temper's loop), and conversations render
    with :data:`TOOL_CHAT_TEMPLATE`."""
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    call_end = tokenizer.convert_tokens_to_ids("</tool_call>")
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, call_end]


class ToolTurnTrainer(GRPOTrainer):
    """TRL's trainer with one change to its tool loop: a turn that stopped at its call is
    closed with the end-of-turn token before the tool's output, as Temper's loop closes it
    (TRL's own suffix assumes the turn ended with that token).  Both sides then train on
    ``...</tool_call><|im_end|>\\n<|im_start|>tool\\n{output}<|im_end|>\\n<|im_start|>assistant\\n``,
    the tool's part out of the loss."""

    def __init__(self, *args: Any, seconds: Seconds, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seconds = seconds

    def _get_tool_suffix_ids(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        suffix = super()._get_tool_suffix_ids(tool_messages)
        return [self._tokenizer.eos_token_id, *suffix]

    def _generate(self, prompts: list[Any]) -> Any:
        """Generation with its tool rounds, timed (the tools' own share is the tool's)."""
        began = time.monotonic()
        try:
            return super()._generate(prompts)
        finally:
            self.seconds["generate"] = self.seconds.get("generate", 0.0) + time.monotonic() - began


# --- training clock, snapshots and step log -----------------------------------------------


#: Figures TRL logs once per generation batch (with the batch's first optimizer step).
_BATCH_METRICS = ("reward", "completions/mean_length", "tools/call_frequency")


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
            "tool_calls_mean": self.batch_metrics.get("tools/call_frequency"),
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
        max_tool_calling_iterations=spec.max_tool_calls if spec.tools else None,
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


def write_summary(
    out_dir: Path, spec: Spec, steps: int, train_seconds: float, seconds: Seconds
) -> dict[str, Any]:
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
        # With tools: seconds in generation with its tool rounds, and in the tools alone.
        "seconds": {name: round(value, 3) for name, value in seconds.items()},
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
    if spec.tools:
        use_tool_format(model, tokenizer)
    with (
        (out_dir / "steps.jsonl").open("w") as steps,
        tempfile.TemporaryDirectory(prefix="grpo-tool-") as scratch,
    ):
        callback = BudgetCallback(spec, out_dir, tokenizer, steps)
        seconds: Seconds = {}
        common: dict[str, Any] = {
            "model": model,
            "reward_funcs": answer_reward_of(spec),
            "args": grpo_config(spec, out_dir),
            "train_dataset": train_dataset(spec),
            "processing_class": tokenizer,
            "callbacks": [callback],
        }
        if spec.tools:
            tools = [python_tool(spec.tool_timeout_s, Path(scratch), seconds)]
            trainer: GRPOTrainer = ToolTurnTrainer(**common, tools=tools, seconds=seconds)
        else:
            trainer = GRPOTrainer(**common)
        trainer.train()
    summary = write_summary(
        out_dir, spec, trainer.state.global_step, callback.step_elapsed, seconds
    )
    log(f"trl done: {json.dumps(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
