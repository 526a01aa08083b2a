"""The learner's settings, in groups: what the trainer takes, how batches are sampled,
when trained rollouts are committed, how weights reach the generators, which rewards
are accepted.

Every group is flat (``metadata=FLAT``, services/runtime/settings.py): its fields read
the variables they would as the learner's own, ``TEMPER_LEARNER_<FIELD>``
(``TEMPER_LEARNER_LR`` sets ``trainer.lr``, ``TEMPER_LEARNER_CLIP_EPS``
``trainer.loss.clip_eps``), so no variable was renamed when they were grouped.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from services.domains.ranges import ScoreRange
from services.learner.acks import AckSettings
from services.learner.broadcast import BroadcastSettings, WeightTransport
from services.learner.distributed import PARALLEL_MODES, ParallelMode
from services.learner.reward_bounds import UNKNOWN_DOMAIN, RewardBounds
from services.learner.trainer import TrainerConfig
from services.runtime.settings import FLAT, RuntimeSettings, SettingsError


@dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    """What the learner asks the replay buffer for."""

    #: Samples per optimizer step (whole groups).
    batch_size: int = 64
    #: Staleness bound sent with every request; ``None`` keeps the buffer's.
    max_staleness: int | None = None
    #: How long the buffer may take to fill a batch; a partial batch is trained on.
    sample_wait_s: float = 5.0
    #: The smallest batch worth a step: the buffer keeps a smaller one until it grows.
    min_samples: int = 8
    #: Take no batch after this many steps (0: no limit); everything trained is
    #: checkpointed and committed, and the service stays up until it is stopped.
    max_steps: int = 0


@dataclass(frozen=True, kw_only=True)
class CommitSettings:
    """Exactly-once: when trained rollouts are checkpointed and committed to the buffer."""

    #: Lease batches until committed (exactly-once); False acks them when served.
    lease: bool = True
    #: A checkpoint (then a commit of the interval before it) every this many batches ...
    checkpoint_every: int = 10
    #: ... or as soon as this many trained samples wait for one: the buffer holds up to
    #: about twice this many leased (commits trail one checkpoint), within its capacity.
    commit_samples: int = 1024
    commit_timeout_s: float = 10.0


@dataclass(frozen=True, kw_only=True)
class WeightSettings:
    """How new policy versions are published and reach the generators."""

    #: Publish a new policy version every this many steps.
    publish_every: int = 1
    #: Published versions kept on disk (``out_dir/weights/v<N>``).
    keep_versions: int = 3
    #: How generators get each version: ``disk`` (they load its directory from a volume
    #: they share) or ``distributed`` (SGLang servers receive a torch.distributed broadcast
    #: from this learner; every version is still written to disk).  docs/operations.md.
    weight_transport: WeightTransport = "disk"
    #: ``distributed``: the address the SGLang servers reach this learner at.
    weight_master_address: str = "127.0.0.1"
    #: ``distributed``: joining a group, or one broadcast, taking longer fails it.
    weight_broadcast_timeout_s: float = 120.0
    #: How long a round waits for every live generator to ack a new version (training
    #: goes on meanwhile); generators that don't are reported lagging.
    weight_ack_timeout_s: float = 60.0

    # The broadcast and ack settings name their fields for their own module; these
    # keep the variable names the learner has always read.
    def broadcast(self) -> BroadcastSettings:
        return BroadcastSettings(
            master_address=self.weight_master_address, timeout_s=self.weight_broadcast_timeout_s
        )

    def acks(self) -> AckSettings:
        return AckSettings(timeout_s=self.weight_ack_timeout_s)


@dataclass(frozen=True, kw_only=True)
class RewardSettings:
    """The domains whose reward ranges the learner enforces: the validator's config (a
    TOML file or a folder; ``None``: the built-in domains) and its plugins."""

    domains_config: Path | None = None
    domain_plugins: bool = True
    #: The rewards accepted for a domain the config does not know, low and high.
    unknown_domain_reward: tuple[float, ...] = (UNKNOWN_DOMAIN.low, UNKNOWN_DOMAIN.high)

    def __post_init__(self) -> None:
        low_high = self.unknown_domain_reward
        if len(low_high) != 2 or not math.isfinite(sum(low_high)) or low_high[0] > low_high[1]:
            raise SettingsError(
                "TEMPER_LEARNER_UNKNOWN_DOMAIN_REWARD is two finite numbers, low,high: "
                f"not {low_high!r}"
            )

    def bounds(self) -> RewardBounds:
        low, high = self.unknown_domain_reward
        unknown = ScoreRange(low, high)
        return RewardBounds.load(self.domains_config, self.domain_plugins, unknown)


@dataclass(frozen=True, kw_only=True)
class LearnerSettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: Starting policy (Hugging Face directory); a checkpoint in ``out_dir`` takes precedence.
    model: Path = Path("models/tiny")
    #: Published weights (``weights/v<N>``), the checkpoint and metrics.jsonl.
    out_dir: Path = Path("run/learner")
    #: Torch intra-op threads; 0 keeps torch's default (every core).  On a machine that
    #: the generator shares, 1 avoids two processes' thread pools spinning on each other.
    threads: int = 0
    device: str = "cpu"
    #: TensorBoard scalars per step under ``out_dir/tensorboard``.
    tensorboard: bool = True
    #: Under torchrun: how long a rank waits in a collective for the others before the
    #: job fails (and how often, at most a quarter of it, an idle rank 0 says so).
    rank_timeout_s: float = 1800.0
    #: Under torchrun: ``ddp`` replicates the model on every rank, ``fsdp`` shards it
    #: (docs/operations.md).  A single process has nothing to shard over and ignores it.
    parallel: ParallelMode = "ddp"
    #: The optimizer and its loss; its ``rewards`` come from :attr:`rewards`.
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata=FLAT)
    sampling: SamplingSettings = field(default_factory=SamplingSettings, metadata=FLAT)
    commits: CommitSettings = field(default_factory=CommitSettings, metadata=FLAT)
    weights: WeightSettings = field(default_factory=WeightSettings, metadata=FLAT)
    rewards: RewardSettings = field(default_factory=RewardSettings, metadata=FLAT)

    def __post_init__(self) -> None:
        if self.parallel not in PARALLEL_MODES:
            raise SettingsError(
                f"TEMPER_LEARNER_PARALLEL={self.parallel!r} is not one of "
                f"{', '.join(PARALLEL_MODES)}"
            )

    def trainer_config(self) -> TrainerConfig:
        """The trainer's settings with the reward ranges of the configured domains."""
        return dataclasses.replace(self.trainer, rewards=self.reward_bounds())

    def reward_bounds(self) -> RewardBounds:
        return self.rewards.bounds()
