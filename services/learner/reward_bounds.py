"""The rewards the learner accepts: each domain's declared range, from the same domain
config the validators are built from (never from the message that carries the reward).

A reward outside it is refused like a malformed rollout: a validator bug, or a candidate
that took over a harness, must not become an advantage out of scale.  The validator
service clamps such scores already; this is the second wall, for a validator (or a
producer of scored rollouts) that does not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from protocol.messages import ScoredRollout
from services.domains import load_registry
from services.domains.ranges import ScoreRange, of_domains

#: Rewards of a domain the learner's config does not know: the range of a validator of
#: the built-in kinds, with a length penalty.
UNKNOWN_DOMAIN = ScoreRange(-1.0, 1.0)


@dataclass(frozen=True)
class RewardBounds:
    ranges: Mapping[str, ScoreRange] = field(default_factory=dict)
    unknown: ScoreRange = UNKNOWN_DOMAIN

    @classmethod
    def load(
        cls, domains_config: Path | None, plugins: bool, unknown: ScoreRange = UNKNOWN_DOMAIN
    ) -> RewardBounds:
        return cls(of_domains(load_registry(domains_config, plugins=plugins)), unknown)

    def of(self, domain: str) -> ScoreRange:
        return self.ranges.get(domain, self.unknown)

    def reason(self, item: ScoredRollout) -> str | None:
        """Why ``item``'s reward cannot be trained on, or None."""
        if not math.isfinite(item.reward):
            return f"reward is {item.reward}"
        domain = item.rollout.task.domain
        allowed = self.of(domain)
        if allowed.contains(item.reward):
            return None
        known = "its" if domain in self.ranges else "an unknown domain's"
        return f"reward {item.reward:g} is outside {known} range {allowed} (domain {domain!r})"
