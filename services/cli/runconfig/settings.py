"""What a run config holds: every setting's TOML key, flag, type, default and allowed values.

One table (``SETTINGS``) drives the flags, the reading of a file and the printing of the
resolved config, so a setting added here is a key and a flag at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, get_args

from services.feeder.settings import Filter

#: The ``source`` of a domain from the built-in registry (``temper domains --local``).
BUILTIN: Final = "builtin"
#: Where a run's files go unless ``run_dir`` says otherwise.
DEFAULT_RUN_DIR: Final = Path("run/train")
#: What the feeder may do with a group scored all alike.
FEEDER_FILTERS: Final[tuple[str, ...]] = get_args(Filter)
#: Supervised warm-up steps of the built-in tiny policy (none for a given ``model``).
DEFAULT_WARMUP_STEPS: Final = 600


class RunConfigError(ValueError):
    """A run config cannot be used: ``where`` is the file (or ``command line``), ``key``
    the dotted key or the flag, ``problem`` what is wrong and what is allowed."""

    def __init__(self, where: str, key: str, problem: str) -> None:
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")
        self.where = where
        self.key = key
        self.problem = problem


@dataclass(frozen=True, kw_only=True)
class DomainEntry:
    """One ``[[domains]]`` entry: a domain of the mix and where it comes from."""

    name: str
    weight: float = 1.0
    #: ``builtin``, or the absolute path of a domains config (file or folder) or a JSONL file.
    source: str = BUILTIN
    #: A JSONL domain's parameters (``style``, ``validator``).
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_jsonl(self) -> bool:
        return self.source.endswith(".jsonl")


@dataclass(frozen=True, kw_only=True)
class TrainPlan:
    """A resolved run config: what ``temper train`` runs."""

    run_dir: Path
    nats_port: int
    #: The start policy (a Hugging Face directory); None: the built-in tiny policy, warmed up.
    model: Path | None = None
    domains: tuple[DomainEntry, ...]
    max_staleness: int
    #: Seeds the feeder's draw of domains.
    seed: int = 0
    lr: float
    lr_decay_steps: int
    batch: int
    minibatches: int
    group: int
    in_flight: int
    #: Groups scored all alike: only counted, their problem skipped, or re-drawn later.
    feeder_filter: str = "count"
    easy_take: float = 0.25
    hard_take: float = 0.5
    minutes: float
    max_steps: int
    eval_domains: tuple[str, ...]
    eval_every: int
    eval_samples: int
    eval_problems: int = 500
    generators: int = 1
    validators: int = 1
    warmup_steps: int
    warmup_target: float
    #: Supervised steps after the warm-up on references that show a failed tool call first.
    warmup_recovery_steps: int = 0
    warmup_recovery_share: float = 0.5
    #: Dotted key -> where its value came from (``FILE: key`` or ``--flag``), for errors.
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def domain_names(self) -> tuple[str, ...]:
        return tuple(entry.name for entry in self.domains)

    def origin(self, key: str) -> str:
        return self.origins.get(key, "the defaults")


Check = Callable[[Any], bool]


@dataclass(frozen=True, kw_only=True)
class Setting:
    #: Dotted TOML key (``learner.lr``).
    key: str
    #: The TrainPlan field it sets.
    field: str
    kind: type
    default: Any
    check: Check = lambda _: True
    #: What is allowed, for the error when ``check`` fails.
    allowed: str = ""
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    @property
    def table(self) -> str:
        return self.key.rpartition(".")[0]

    @property
    def name(self) -> str:
        return self.key.rpartition(".")[2]


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def _non_negative(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def _at_least_one(value: int) -> bool:
    return value >= 1


def _fraction(value: float) -> bool:
    return 0.0 <= value <= 1.0


def _port(value: int) -> bool:
    return 1 <= value <= 65535


SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        key="model",
        field="model",
        kind=Path,
        default=None,
        help="start policy: a Hugging Face model directory, used as it is (no warm-up)",
    ),
    Setting(
        key="run_dir",
        field="run_dir",
        kind=Path,
        default=DEFAULT_RUN_DIR,
        help="where the run writes; a second run continues from its learner's checkpoint",
    ),
    Setting(
        key="nats_port",
        field="nats_port",
        kind=int,
        default=4223,
        check=_port,
        allowed="1..65535",
        help="port of the run's own nats-server (127.0.0.1)",
    ),
    Setting(
        key="max_staleness",
        field="max_staleness",
        kind=int,
        default=2,
        check=_non_negative,
        allowed="a whole number >= 0",
        help="policy versions a sample may lag the learner when trained on (admission and "
        "replay bound); 0 trains on-policy: generation waits for each new version",
    ),
    Setting(
        key="seed",
        field="seed",
        kind=int,
        default=0,
        help="seeds the feeder's weighted draw of domains",
    ),
    Setting(
        key="learner.lr",
        field="lr",
        kind=float,
        default=3e-4,
        check=_positive,
        allowed="> 0",
        help="the learner's (AdamW) learning rate",
    ),
    Setting(
        key="learner.lr_decay_steps",
        field="lr_decay_steps",
        kind=int,
        default=600,
        check=_non_negative,
        allowed="a whole number >= 0",
        help="the learning rate falls linearly to a tenth over this many steps (0: constant)",
    ),
    Setting(
        key="learner.batch",
        field="batch",
        kind=int,
        default=256,
        check=_at_least_one,
        allowed="a whole number >= 1",
        help="samples per learner step",
    ),
    Setting(
        key="learner.minibatches",
        field="minibatches",
        kind=int,
        default=2,
        check=_at_least_one,
        allowed="a whole number >= 1",
        help="optimizer steps per batch",
    ),
    Setting(
        key="learner.group",
        field="group",
        kind=int,
        default=8,
        check=_at_least_one,
        allowed="a whole number >= 1",
        help="samples per task (GRPO group)",
    ),
    Setting(
        key="feeder.in_flight",
        field="in_flight",
        kind=int,
        default=64,
        check=_at_least_one,
        allowed="a whole number >= 1",
        help="tasks kept outstanding, over all domains",
    ),
    Setting(
        key="feeder.filter",
        field="feeder_filter",
        kind=str,
        default="count",
        check=lambda value: value in FEEDER_FILTERS,
        allowed=" or ".join(f'"{f}"' for f in FEEDER_FILTERS),
        help="groups scored all alike (no signal for GRPO): only count them, skip their "
        "problem for the rest of the run, or draw it again two epochs later",
    ),
    Setting(
        key="feeder.easy_take",
        field="easy_take",
        kind=float,
        default=0.25,
        check=_fraction,
        allowed="0..1",
        help="share of easy problems (last pass rate 1) the feeder takes as its cursor meets them",
    ),
    Setting(
        key="feeder.hard_take",
        field="hard_take",
        kind=float,
        default=0.5,
        check=_fraction,
        allowed="0..1",
        help="share of hard problems (last pass rate 0) the feeder takes as its cursor meets them",
    ),
    Setting(
        key="budget.minutes",
        field="minutes",
        kind=float,
        default=10.0,
        check=_non_negative,
        allowed=">= 0 (0: no time limit)",
        help="train for this long (0: no time limit; then set --max-steps)",
    ),
    Setting(
        key="budget.max_steps",
        field="max_steps",
        kind=int,
        default=0,
        check=_non_negative,
        allowed="a whole number >= 0 (0: no limit)",
        help="stop after this many learner steps (0: no limit)",
    ),
    Setting(
        key="eval.domains",
        field="eval_domains",
        kind=tuple,
        default=None,
        help="comma-separated domains whose held-out split is evaluated",
    ),
    Setting(
        key="eval.every",
        field="eval_every",
        kind=int,
        default=40,
        check=_non_negative,
        allowed="a whole number >= 0",
        help="held-out evaluation every N policy versions (0: only at the start and the end)",
    ),
    Setting(
        key="eval.samples",
        field="eval_samples",
        kind=int,
        default=4,
        check=_non_negative,
        allowed="a whole number >= 0",
        help="sampled answers per held-out problem (pass@k)",
    ),
    Setting(
        key="eval.problems",
        field="eval_problems",
        kind=int,
        default=500,
        check=_at_least_one,
        allowed="a whole number >= 1",
        help="held-out problems per domain, at most",
    ),
    Setting(
        key="instances.generator",
        field="generators",
        kind=int,
        default=1,
        check=_at_least_one,
        allowed="a whole number >= 1",
        help="generator processes (the embedded stack runs one)",
    ),
    Setting(
        key="instances.validator",
        field="validators",
        kind=int,
        default=1,
        check=_at_least_one,
        allowed="a whole number >= 1",
        help="validator processes (the embedded stack runs one)",
    ),
    Setting(
        key="warmup.steps",
        field="warmup_steps",
        kind=int,
        default=DEFAULT_WARMUP_STEPS,
        check=_non_negative,
        allowed="a whole number >= 0",
        help="most supervised steps of the tiny policy's warm-up (0: none)",
    ),
    Setting(
        key="warmup.target",
        field="warmup_target",
        kind=float,
        default=0.25,
        check=_fraction,
        allowed="a number in [0, 1]",
        help="the warm-up stops when greedy accuracy on train problems reaches this "
        "(0: no target, all --warmup-steps)",
    ),
    Setting(
        key="warmup.recovery_steps",
        field="warmup_recovery_steps",
        kind=int,
        default=0,
        check=_non_negative,
        allowed="a whole number >= 0",
        help="supervised steps after the warm-up in which --warmup-recovery-share of the tool "
        "domains' references show a failed call, the sandbox's error and the fixed call "
        "(0: none)",
    ),
    Setting(
        key="warmup.recovery_share",
        field="warmup_recovery_share",
        kind=float,
        default=0.5,
        check=_fraction,
        allowed="a number in [0, 1]",
        help="share of the tool problems whose reference shows the failed call in the "
        "--warmup-recovery-steps",
    ),
)

BY_KEY: Final[Mapping[str, Setting]] = {s.key: s for s in SETTINGS}
#: Tables of the file, in the order they are printed; ``domains`` is an array of tables.
TABLES: Final[tuple[str, ...]] = ("learner", "feeder", "budget", "eval", "instances", "warmup")
DOMAIN_KEYS: Final[tuple[str, ...]] = ("name", "weight", "source", "params")
