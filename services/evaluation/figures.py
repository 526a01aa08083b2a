"""A learner step's figures per domain, as ``metrics.jsonl`` holds them under ``domains``
(written by the learner, read by the report and the reward-hacking watch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

#: Bins of a domain's reward histogram, over its declared range.
BINS: Final = 10


@dataclass(frozen=True, slots=True)
class DomainFigures:
    samples: int
    #: Samples at the domain's top score, and the mean completion length (tokens) of those
    #: and of all the step's samples of the domain.
    at_top: int
    top_len: float
    len_mean: float
    #: Samples per bin of the domain's range, lowest first.
    histogram: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "at_top": self.at_top,
            "top_len": self.top_len,
            "len_mean": self.len_mean,
            "histogram": list(self.histogram),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DomainFigures:
        return cls(
            samples=int(raw["samples"]),
            at_top=int(raw["at_top"]),
            top_len=float(raw["top_len"]),
            len_mean=float(raw["len_mean"]),
            histogram=tuple(int(n) for n in raw["histogram"]),
        )
