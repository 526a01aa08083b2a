"""Validator service settings (``TEMPER_VALIDATOR_<FIELD>`` in the environment)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from protocol import subjects
from services.runtime.settings import RuntimeSettings

#: Which rendered CAD parts get a PNG preview: held-out (eval) ones, all of them, or none.
PreviewMode = Literal["heldout", "all", "off"]
PREVIEW_MODES: Final[tuple[PreviewMode, ...]] = ("heldout", "all", "off")


def preview_mode(value: str) -> PreviewMode:
    """``value`` as a mode, or a ValueError naming the choices."""
    for mode in PREVIEW_MODES:
        if value == mode:
            return mode
    raise ValueError(
        f"TEMPER_VALIDATOR_CAD_PREVIEWS={value!r}: expected one of {', '.join(PREVIEW_MODES)}"
    )


@dataclass(frozen=True, kw_only=True)
class ValidatorSettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: A TOML file or a folder of them (deploy/domains); ``None`` serves the built-in domains.
    domains_config: Path | None = None
    #: Load domains from installed ``temper.domains`` plugins too.
    domain_plugins: bool = True
    #: Durable consumer on TEMPER_ROLLOUTS shared by every instance (its queue group).
    durable: str = "validator"
    #: Rollouts judged at once by one instance.
    max_in_flight: int = 256
    fetch_wait_s: float = 1.0
    ack_wait_s: float = 60.0
    max_deliver: int = 5
    #: Default time one validator may take on one rollout; a spec's ``timeout_s`` overrides it.
    validator_timeout_s: float = 60.0
    #: Reward-model batching: up to this many texts per forward pass ...
    reward_batch_size: int = 16
    #: ... waiting at most this long for the batch to fill.
    reward_batch_wait_s: float = 0.01
    sandbox_subject: str = subjects.sandbox_exec()
    #: Candidate time limit for domains that set none.
    sandbox_timeout_s: float = 30.0
    #: Added to the candidate's time limit to get the request's timeout.
    sandbox_grace_s: float = 5.0
    #: How long to wait for TEMPER_SCORED to store a result before handing the rollout back.
    publish_timeout_s: float = 10.0
    #: Collections of the youngest GC generation every this many allocations (Python's
    #: default: 700), and what is loaded at start frozen out of collections.  It is the
    #: whole process's collector (an embedded stack's too); 0 leaves it as it is.
    young_gc_threshold: int = 50_000
    #: Which rendered CAD parts get a small PNG preview in their details, for evaluation
    #: reports: ``heldout`` (eval-split tasks), ``all`` or ``off``.
    cad_previews: str = "heldout"

    def __post_init__(self) -> None:
        preview_mode(self.cad_previews)  # a typo fails at start, not at the first part
