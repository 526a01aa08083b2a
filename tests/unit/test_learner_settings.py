"""The learner's grouped settings read every variable the flat ones did, into the field
that now holds it; ``trainer_config()`` is the trainer group with the domains' rewards."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from services.domains.ranges import ScoreRange
from services.learner.acks import AckSettings
from services.learner.broadcast import BroadcastSettings
from services.learner.loss import LossConfig
from services.learner.reward_bounds import RewardBounds
from services.learner.settings import LearnerSettings, RewardSettings, WeightSettings
from services.learner.trainer import TrainerConfig
from services.runtime.settings import SettingsError, from_env, variables

PREFIX = "TEMPER_LEARNER_"

#: Every variable the learner read while its settings were one flat dataclass: the
#: value set, and where it must land.  None of these may be renamed.
BEFORE_GROUPING: dict[str, tuple[str, str, Any]] = {
    "TEMPER_LEARNER_MODEL": ("/policy", "model", Path("/policy")),
    "TEMPER_LEARNER_OUT_DIR": ("/run/l", "out_dir", Path("/run/l")),
    "TEMPER_LEARNER_BATCH_SIZE": ("17", "sampling.batch_size", 17),
    "TEMPER_LEARNER_LR": ("0.003", "trainer.lr", 0.003),
    "TEMPER_LEARNER_LR_DECAY_STEPS": ("50", "trainer.lr_decay_steps", 50),
    "TEMPER_LEARNER_LR_FINAL": ("0.5", "trainer.lr_final", 0.5),
    "TEMPER_LEARNER_CLIP_EPS": ("0.3", "trainer.loss.clip_eps", 0.3),
    "TEMPER_LEARNER_IS_CAP": ("3.5", "trainer.loss.is_cap", 3.5),
    "TEMPER_LEARNER_KL_COEF": ("0.01", "trainer.loss.kl_coef", 0.01),
    "TEMPER_LEARNER_ENTROPY_COEF": ("0.02", "trainer.loss.entropy_coef", 0.02),
    "TEMPER_LEARNER_GRAD_CLIP": ("2.5", "trainer.grad_clip", 2.5),
    "TEMPER_LEARNER_MICRO_BATCH": ("5", "trainer.micro_batch", 5),
    "TEMPER_LEARNER_EPOCHS": ("2", "trainer.epochs", 2),
    "TEMPER_LEARNER_MINIBATCHES": ("3", "trainer.minibatches", 3),
    "TEMPER_LEARNER_SKIP_ZERO_ADVANTAGE": ("false", "trainer.skip_zero_advantage", False),
    "TEMPER_LEARNER_THREADS": ("2", "threads", 2),
    "TEMPER_LEARNER_TENSORBOARD": ("false", "tensorboard", False),
    "TEMPER_LEARNER_MAX_STALENESS": ("4", "sampling.max_staleness", 4),
    "TEMPER_LEARNER_PUBLISH_EVERY": ("6", "weights.publish_every", 6),
    "TEMPER_LEARNER_CHECKPOINT_EVERY": ("7", "commits.checkpoint_every", 7),
    "TEMPER_LEARNER_COMMIT_SAMPLES": ("99", "commits.commit_samples", 99),
    "TEMPER_LEARNER_KEEP_CHECKPOINTS": ("8", "trainer.keep_checkpoints", 8),
    "TEMPER_LEARNER_KEEP_VERSIONS": ("9", "weights.keep_versions", 9),
    "TEMPER_LEARNER_LEASE": ("false", "commits.lease", False),
    "TEMPER_LEARNER_COMMIT_TIMEOUT_S": ("11.5", "commits.commit_timeout_s", 11.5),
    "TEMPER_LEARNER_WEIGHT_ACK_TIMEOUT_S": ("12.5", "weights.weight_ack_timeout_s", 12.5),
    "TEMPER_LEARNER_WEIGHT_TRANSPORT": (
        "distributed",
        "weights.weight_transport",
        "distributed",
    ),
    "TEMPER_LEARNER_WEIGHT_MASTER_ADDRESS": (
        "10.0.0.7",
        "weights.weight_master_address",
        "10.0.0.7",
    ),
    "TEMPER_LEARNER_WEIGHT_BROADCAST_TIMEOUT_S": (
        "13.5",
        "weights.weight_broadcast_timeout_s",
        13.5,
    ),
    "TEMPER_LEARNER_SAMPLE_WAIT_S": ("0.25", "sampling.sample_wait_s", 0.25),
    "TEMPER_LEARNER_MIN_SAMPLES": ("2", "sampling.min_samples", 2),
    "TEMPER_LEARNER_MAX_STEPS": ("100", "sampling.max_steps", 100),
    "TEMPER_LEARNER_DEVICE": ("cuda", "device", "cuda"),
    "TEMPER_LEARNER_SEED": ("42", "trainer.seed", 42),
    "TEMPER_LEARNER_RANK_TIMEOUT_S": ("60", "rank_timeout_s", 60.0),
    "TEMPER_LEARNER_PARALLEL": ("fsdp", "parallel", "fsdp"),
    "TEMPER_LEARNER_DOMAINS_CONFIG": ("/domains", "rewards.domains_config", Path("/domains")),
    "TEMPER_LEARNER_DOMAIN_PLUGINS": ("false", "rewards.domain_plugins", False),
    "TEMPER_LEARNER_UNKNOWN_DOMAIN_REWARD": (
        "-2,3",
        "rewards.unknown_domain_reward",
        (-2.0, 3.0),
    ),
    "TEMPER_LEARNER_RUNTIME_NATS_URL": ("nats://l:1", "runtime.nats_url", "nats://l:1"),
}

#: Read since the grouping: the trainer's field that had no variable before.
ADDED = {
    "TEMPER_LEARNER_WEIGHT_DECAY": "trainer.weight_decay",
    "TEMPER_LEARNER_MICRO_TOKENS": "trainer.micro_tokens",
    "TEMPER_LEARNER_SHARE_PROMPTS": "trainer.share_prompts",
}


def _at(settings: object, path: str) -> Any:
    value = settings
    for name in path.split("."):
        value = getattr(value, name)
    return value


def test_every_variable_read_before_the_grouping_lands_in_its_field() -> None:
    environ = {name: raw for name, (raw, _, _) in BEFORE_GROUPING.items()}
    settings = from_env(LearnerSettings, PREFIX, environ)
    for name, (_, path, expected) in BEFORE_GROUPING.items():
        assert _at(settings, path) == expected, name
        # Set alone, each variable changes its field only.
        alone = from_env(LearnerSettings, PREFIX, {name: environ[name]})
        assert alone == _with(LearnerSettings(), path, expected), name


def _with(settings: Any, path: str, value: Any) -> Any:
    """``settings`` with the field at dotted ``path`` replaced."""
    head, _, rest = path.partition(".")
    if not rest:
        return dataclasses.replace(settings, **{head: value})
    return dataclasses.replace(settings, **{head: _with(getattr(settings, head), rest, value)})


def test_the_learner_reads_no_other_variable_of_its_own() -> None:
    read = variables(LearnerSettings, PREFIX)
    own = {name: path for name, path in read.items() if not path.startswith("runtime.")}
    before = {n: p for n, (_, p, _) in BEFORE_GROUPING.items() if not p.startswith("runtime.")}
    assert own == before | ADDED
    # The rewards the trainer enforces come from the domain config, never a variable.
    assert "TEMPER_LEARNER_REWARDS" not in read


def test_the_settings_added_since_are_settable() -> None:
    settings = from_env(LearnerSettings, PREFIX, {"TEMPER_LEARNER_WEIGHT_DECAY": "0.01"})
    assert settings.trainer.weight_decay == 0.01
    settings = from_env(LearnerSettings, PREFIX, {"TEMPER_LEARNER_MICRO_TOKENS": "2048"})
    assert settings.trainer.micro_tokens == 2048


def test_trainer_config_is_the_trainer_group_with_the_domains_rewards() -> None:
    trainer = TrainerConfig(lr=0.5, epochs=2, loss=LossConfig(kl_coef=0.1), weight_decay=0.2)
    settings = LearnerSettings(
        trainer=trainer,
        rewards=RewardSettings(unknown_domain_reward=(-3.0, 4.0), domain_plugins=False),
    )
    config = settings.trainer_config()
    assert config.rewards.unknown == ScoreRange(-3.0, 4.0)
    assert "arithmetic" in " ".join(config.rewards.ranges), "the built-in domains' ranges"
    assert dataclasses.replace(config, rewards=RewardBounds()) == trainer


def test_weight_settings_give_the_broadcast_and_ack_settings() -> None:
    weights = WeightSettings(
        weight_master_address="10.0.0.7", weight_broadcast_timeout_s=9.0, weight_ack_timeout_s=4.0
    )
    assert weights.broadcast() == BroadcastSettings(master_address="10.0.0.7", timeout_s=9.0)
    assert weights.acks() == AckSettings(timeout_s=4.0)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"TEMPER_LEARNER_UNKNOWN_DOMAIN_REWARD": "1,0"},
            "TEMPER_LEARNER_UNKNOWN_DOMAIN_REWARD is two finite numbers",
        ),
        ({"TEMPER_LEARNER_UNKNOWN_DOMAIN_REWARD": "1"}, "TEMPER_LEARNER_UNKNOWN_DOMAIN_REWARD"),
        ({"TEMPER_LEARNER_PARALLEL": "zero"}, "TEMPER_LEARNER_PARALLEL='zero'"),
        ({"TEMPER_LEARNER_LR": "fast"}, "TEMPER_LEARNER_LR='fast'"),
        ({"TEMPER_LEARNER_MICRO_BATCH": "0"}, "TEMPER_LEARNER_.*micro_batch must be at least 1"),
        ({"TEMPER_LEARNER_MICRO_TOKENS": "0"}, "TEMPER_LEARNER_.*micro_tokens must be at least 1"),
        ({"TEMPER_LEARNER_LR_FINAL": "2"}, "TEMPER_LEARNER_.*lr_final in"),
    ],
)
def test_bad_values_are_settings_errors_naming_the_variable(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        from_env(LearnerSettings, PREFIX, environ)
