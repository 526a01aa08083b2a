"""The ``reasoning_gym`` validator: a reasoning-gym dataset's own scorer judges the answer.

The task names its entry (dataset, parameters, seed, size, index and a digest of the
question, ``metadata["reasoning_gym"]``); the entry is rebuilt here, in the validator's
process, from that name alone.  Of the completion only the extracted answer is read, and
it reaches the scorer only when it is at most ``max_answer_chars`` long.

Who caused it decides the status: a task whose entry cannot be rebuilt (a malformed name,
a refused or unknown dataset, a question that does not match its digest) is ``invalid``;
a scorer that raises on the candidate's answer scores 0 like any answer it cannot read,
unless it raises on the entry's own answer too, when the task cannot be judged
(``invalid``).  Nothing here is an ``infra_failure``: no machinery of ours can fail.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from protocol.messages import Rollout, Task
from services.domains import reasoning_gym as rg
from services.domains.reasoning_gym_keys import question_digest
from services.validator import extract
from services.validator.base import InvalidRollout, RuleValidator, Verdict, reference

#: Datasets a judge keeps built (a domain uses one; a task may name another).
CACHED_DATASETS: Final = 8
#: Entries a judge keeps built: a GRPO group's samples, and a batch's groups, share them.
CACHED_ENTRIES: Final = 1024
#: Scores this far outside [0, 1] are floating-point noise, clamped without a note.
_NOISE: Final = 1e-9


def _dataset(ref: rg.DatasetRef) -> Any:
    try:
        return rg.create(ref)
    except rg.DatasetError as error:
        raise InvalidRollout(str(error)) from None


def _entry(datasets: Callable[[rg.DatasetRef], Any], ref: rg.EntryRef) -> dict[str, Any]:
    dataset = datasets(ref.dataset)
    try:
        entry: dict[str, Any] = dataset[ref.index]
    except Exception as error:
        message = f"{ref.dataset.name} cannot rebuild entry {ref.index}: {error!r}"
        raise InvalidRollout(message) from None
    if question_digest(str(entry.get("question"))) != ref.digest:
        raise InvalidRollout(
            f"{ref.dataset.name} entry {ref.index} rebuilt here is not the task's question "
            "(another reasoning-gym version, or a dataset that is not deterministic)"
        )
    return entry


class Entries:
    """Built datasets and entries, each cache bounded (the least recently used goes first).

    An entry is shared by every rollout of its task, uncopied (a copy would cost more than
    most scores): the registered datasets' scorers only read it, which a unit test checks.
    """

    def __init__(self) -> None:
        self.dataset = functools.lru_cache(maxsize=CACHED_DATASETS)(_dataset)
        self._entry = functools.lru_cache(maxsize=CACHED_ENTRIES)(self._build)

    def _build(self, ref: rg.EntryRef) -> dict[str, Any]:
        return _entry(self.dataset, ref)

    def get(self, ref: rg.EntryRef) -> tuple[Any, dict[str, Any]]:
        return self.dataset(ref.dataset), self._entry(ref)


def entry_ref(task: Task) -> rg.EntryRef:
    """The entry ``task`` names; InvalidRollout if it names none, or one that is refused."""
    try:
        ref = rg.EntryRef.from_metadata(reference(task, rg.METADATA))
    except ValueError as error:
        raise InvalidRollout(f"task {task.id}: {error}") from None
    if ref.dataset.name in rg.UNSAFE:
        reason = rg.UNSAFE[ref.dataset.name]
        raise InvalidRollout(f"task {task.id}: dataset {ref.dataset.name!r} is refused: {reason}")
    return ref


@dataclass(frozen=True)
class ReasoningGymScore(RuleValidator):
    """The dataset's ``score_answer(answer, entry)`` of the extracted answer, in [0, 1]."""

    extract: extract.Extract = "tag"
    max_answer_chars: int = rg.DEFAULT_MAX_ANSWER_CHARS
    cache: Entries = field(default_factory=Entries, compare=False)

    def check(self, rollout: Rollout) -> Verdict:
        # The task first: whether it can be judged never depends on the answer.
        ref = entry_ref(rollout.task)
        dataset, entry = self.cache.get(ref)
        answer = extract.answer(rollout.completion_text, self.extract)
        if answer is None:
            return Verdict(0.0, f"no answer found (extract={self.extract})")
        if len(answer) > self.max_answer_chars:
            return Verdict(
                0.0, f"answer of {len(answer)} characters, over the {self.max_answer_chars} read"
            )
        try:
            raw = dataset.score_answer(answer, entry)
        except Exception as error:
            return _refused(dataset, entry, error)
        return _verdict(raw, ref.dataset.name)


def _refused(dataset: Any, entry: dict[str, Any], error: Exception) -> Verdict:
    """A scorer that raised: on the candidate's answer alone it scores 0, else it is broken."""
    try:
        dataset.score_answer(str(entry["answer"]), entry)
    except Exception as own:
        raise InvalidRollout(f"the scorer fails on the entry's own answer: {own!r}") from None
    return Verdict(0.0, f"the scorer refused the answer: {type(error).__name__}: {error}")


def _verdict(raw: Any, dataset: str) -> Verdict:
    try:
        score = float(raw)
    except (TypeError, ValueError):
        raise InvalidRollout(f"the {dataset} scorer returned {raw!r}, not a number") from None
    if math.isnan(score):
        raise InvalidRollout(f"the {dataset} scorer returned nan")
    clamped = min(max(score, 0.0), 1.0)
    message = f"scored by reasoning-gym {dataset}"
    if abs(clamped - score) > _NOISE:
        message += f" (its score {score:g} clamped into [0, 1])"
    return Verdict(clamped, message)
