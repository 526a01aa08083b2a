"""Pictures of what was judged (a CAD part's render) picked for a domain's report.

A validator may attach a small PNG to its detail (``ValidatorDetail.preview``).  A
report keeps a few per domain, the best and the worst reward, so a reader sees what
a good and a bad answer looked like without the report growing with the eval split.
They are stored base64 in ``report.json`` (``domains.<name>.previews``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from protocol.messages import ScoredRollout

if TYPE_CHECKING:
    from services.evaluation.tiers import Outcome

#: Previews kept at each end of a domain's reward range (best ones, worst ones).
PER_END: Final = 1
#: A caption's note (the validator's message) is cut here: it names every failed check.
NOTE_CHARS: Final = 240


@dataclass(frozen=True)
class Shown:
    """The preview a scored rollout carries and what its validator said about it."""

    png: bytes | None
    note: str


def shown(scored: ScoredRollout) -> Shown:
    """The first preview among the rollout's details, with that detail's message."""
    for detail in scored.details:
        if detail.preview:
            return Shown(detail.preview, detail.message)
    return Shown(None, "")


def pick(outcomes: Sequence[Outcome], per_end: int = PER_END) -> list[Outcome]:
    """The ``per_end`` best and worst outcomes by reward among those with a preview."""
    drawn = sorted(
        (o for o in outcomes if o.preview), key=lambda o: (-o.reward, o.problem, not o.greedy)
    )
    if len(drawn) <= 2 * per_end:
        return drawn
    return drawn[:per_end] + drawn[-per_end:]


def domain_previews(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """The picked previews as ``report.json`` entries (PNG bytes base64)."""
    return [
        {
            "problem": o.problem,
            "greedy": o.greedy,
            "status": o.status,
            "reward": o.reward,
            "note": o.note[:NOTE_CHARS],
            "png": base64.b64encode(o.preview or b"").decode("ascii"),
        }
        for o in pick(outcomes)
    ]


@dataclass(frozen=True)
class Preview:
    """One preview of a report, read back."""

    problem: str
    greedy: bool
    status: str
    reward: float
    note: str
    png: bytes

    @property
    def caption(self) -> str:
        kind = "greedy" if self.greedy else "sampled"
        said = f": {self.note}" if self.note else ""
        return f"{self.problem} ({kind}, {self.status}) reward {self.reward:.3g}{said}"


def parse_previews(raw: object) -> tuple[Preview, ...]:
    """The readable entries of ``domains.<name>.previews``; a malformed one is left out,
    as a picture is not worth losing the rest of the report over."""
    if not isinstance(raw, list):
        return ()
    found = []
    for entry in raw:
        try:
            found.append(_preview(entry))
        except (KeyError, TypeError, ValueError, binascii.Error):
            continue
    return tuple(found)


def _preview(entry: dict[str, Any]) -> Preview:
    return Preview(
        problem=str(entry["problem"]),
        greedy=bool(entry.get("greedy", False)),
        status=str(entry.get("status", "")),
        reward=float(entry["reward"]),
        note=str(entry.get("note", "")),
        png=base64.b64decode(entry["png"], validate=True),
    )
