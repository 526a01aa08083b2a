"""Generator settings (env ``TEMPER_GENERATOR_*``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from services.generator.scheduling.scheduler import SchedulingSettings
from services.runtime.settings import RuntimeSettings

EngineName = Literal["torch", "sglang"]
#: Torch engine weight and activation types; empty: bfloat16 on a GPU, float32 on a CPU.
DtypeName = Literal["", "float32", "bfloat16", "float16"]
Toolbox = Literal["sandbox", "local"]
ENGINES: tuple[str, ...] = get_args(EngineName)
DTYPES: tuple[str, ...] = get_args(DtypeName)
TOOLBOXES: tuple[str, ...] = get_args(Toolbox)


@dataclass(frozen=True, kw_only=True)
class GeneratorSettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: Hugging Face model directory (``temper model init DIR`` makes a tiny one).
    model: Path = Path("models/tiny")
    #: ``torch`` (embedded, CPU or one GPU) or ``sglang`` (servers at ``sglang_urls``).
    engine: EngineName = "torch"
    sglang_urls: tuple[str, ...] = ()
    #: At start, refuse SGLang servers whose logprobs are temperature-scaled (importance
    #: ratios against them would be wrong).  Off only where every task samples at
    #: temperature 1, or where no rollout trains (routing and load tests).
    sglang_check_raw_logprobs: bool = True
    #: ``cpu``, ``cuda``; empty picks cuda when available.
    device: str = ""
    #: Torch engine dtype (``float32``, ``bfloat16``, ``float16``); empty: bfloat16 on a GPU,
    #: float32 on a CPU, where behaviour logprobs then match a float32 learner's.
    #: ``bfloat16`` is about 2x faster on CPUs with AVX512-BF16, slower on others.
    dtype: DtypeName = ""
    #: On a CPU, time both forms of the linear layers' few-row products (decode steps)
    #: when the model loads and use the faster per weight shape (about 1.7 s at start-up
    #: for a 20M-parameter model, none under 16 MB of weights; results agree to float
    #: rounding).
    tune_linears: bool = True
    #: Torch intra-op threads of the torch engine; 0 keeps torch's default (every core).
    #: Where the learner shares the machine, 1 keeps the two thread pools from spinning
    #: on each other's cores.
    threads: int = 0
    #: Admission by staleness: samples this instance may have started ahead of what the
    #: learner has consumed (the learner's batch size times the staleness it may train
    #: on); 0 admits every task at once.  Eval-split tasks are never held back.
    admission_samples: int = 0
    #: Memory bound of the torch engine's prefix cache.
    prefix_cache_mb: int = 256
    #: Tasks generated at once by this instance, across all priority tiers.
    max_concurrent_tasks: int = 4
    #: A generation turn that takes longer is an infrastructure failure.
    turn_timeout_s: float = 120.0
    #: Prompt plus completion when the task does not say; never more than the model's context.
    max_total_tokens: int = 2048
    #: ``sandbox`` runs tool calls in the sandbox service; ``local`` are in-process test tools.
    tools: Toolbox = "sandbox"
    tool_timeout_s: float = 60.0
    #: Hold a tool-using task until the sandbox pool reports a free session for it.
    sandbox_admission: bool = True
    #: A sandbox instance's report counts this long (it publishes every ``stats_s``).
    sandbox_report_stale_s: float = 30.0
    #: Tasks whose domain is not registered come back as invalid rollouts.
    check_domains: bool = True
    #: Domain config (TOML); none means the built-in domains.
    domains_config: Path | None = None
    #: Preemption at a turn boundary: while every slot is taken and a higher tier has
    #: work waiting, a running lower-tier multi-turn task yields at its next turn
    #: boundary and is re-queued with its state (checked every ``preempt_check_s``).
    preemption: bool = True
    preempt_check_s: float = 0.05
    #: Retries of failed samples for tasks whose domain the registry does not know (or
    #: with ``check_domains`` off); a known domain's come from its ``retry`` config.
    retry_max_attempts: int = 3
    retry_backoff_s: float = 1.0
    #: Task redelivery deadline; in-progress acks push it back during long rollouts.
    ack_wait_s: float = 60.0
    max_deliver: int = 5
    weight_update_timeout_s: float = 300.0
    #: ``torch_distributed`` updates: a request to the learner's weight subject.
    weight_request_timeout_s: float = 10.0
    #: After a failed broadcast, load the version from the directory the update names
    #: (when it names one and this host sees it); off: the update fails and is acked so.
    weight_disk_fallback: bool = True
    fetch_wait_s: float = 1.0
    #: Fair share between domains and flaky-domain quarantine (``TEMPER_GENERATOR_SCHEDULING_*``).
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES[1:])}")
        if self.tools not in TOOLBOXES:
            raise ValueError(f"tools {self.tools!r} is not one of {', '.join(TOOLBOXES)}")
        if self.engine == "sglang" and not self.sglang_urls:
            raise ValueError("engine sglang needs sglang_urls (TEMPER_GENERATOR_SGLANG_URLS)")
        if self.max_concurrent_tasks < 1:
            raise ValueError("max_concurrent_tasks must be at least 1")
