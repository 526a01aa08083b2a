"""The gateway's settings (``TEMPER_GATEWAY_*``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from protocol import subjects
from protocol.messages import DEFAULT_TIER, TIERS
from services.runtime.settings import RuntimeSettings


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: Loopback by default: serving other hosts is a choice (``0.0.0.0``).
    host: str = "127.0.0.1"
    #: 0 picks a free port (tests); the service reports the one it got.
    port: int = 8400
    #: The id ``/v1/models`` lists and requests must name.
    model_id: str = "temper-policy"
    #: The policy's model directory, the one the generators serve: its tokenizer and chat
    #: template make the prompt ids, its ``config.json`` gives the context length.
    model: Path | None = None
    #: The domain calls are scheduled in (fair share between its tenants) and a rewarded
    #: session's rollouts carry.
    domain: str = "gateway"
    #: The domains whose problems sessions may answer, scored by their validators: the
    #: registry the validators load (None: the built-in domains).
    domains_config: Path | None = None
    #: How long a call waits for a generator's answer (504 after).
    call_timeout_s: float = 120.0
    #: Completion tokens when a request does not say (and room is left in the context).
    max_tokens: int = 512
    #: API keys: a TOML or JSON file (docs/gateway.md) ...
    keys_file: Path | None = None
    #: ... and/or the same JSON in ``TEMPER_GATEWAY_KEYS``.  Never shown in a repr.
    keys: str = field(default="", repr=False)
    #: A request body larger than this is refused (413) before it is read whole.
    max_body_bytes: int = 4 << 20
    #: The defaults of a key that does not set its own: priority tier, ...
    tier: int = DEFAULT_TIER
    #: ... requests per second (0: unlimited) with a burst of this many, ...
    rate_per_s: float = 10.0
    burst: int = 20
    #: ... and how long a session may stay idle before it is dropped (never trained on).
    session_timeout_s: float = 600.0
    #: Open sessions at most (all keys together), and trajectories in one session.
    max_sessions: int = 10_000
    max_trajectories: int = 64
    #: A trajectory whose oldest turn is more versions behind than this is not continued
    #: (the learner would drop it whole); the call starts a new one.  Set it to the
    #: learner's ``max_staleness``; 0: no bound.
    max_staleness: int = 0
    #: Where the journal of open sessions is kept (a gateway killed with sessions open
    #: reports them lost when it starts again); None: no journal.  One per instance.
    state_dir: Path | None = None
    #: How often expired sessions are looked for.
    reap_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is outside 0..65535")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, not {self.max_body_bytes}")
        if not 0 <= self.tier < TIERS:
            raise ValueError(f"tier {self.tier} is outside 0..{TIERS - 1}")
        if self.rate_per_s < 0 or self.burst < 1:
            raise ValueError("rate_per_s must be at least 0 and burst at least 1")
        if self.session_timeout_s <= 0 or self.reap_s <= 0:
            raise ValueError("session_timeout_s and reap_s must be positive")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be at least 0, not {self.max_staleness}")
        if self.max_sessions < 1 or self.max_trajectories < 1:
            raise ValueError("max_sessions and max_trajectories must be at least 1")
        if not self.model_id:
            raise ValueError("model_id must not be empty")
        subjects.token(self.domain, "domain")
        if self.call_timeout_s <= 0 or self.max_tokens < 1:
            raise ValueError("call_timeout_s must be positive and max_tokens at least 1")
