"""reasoning-gym as a domain kind: one of its procedural datasets, judged by its own scorer.

reasoning-gym (pinned in pyproject.toml) builds entry ``i`` of a dataset from the
dataset's parameters, its ``seed`` and ``size`` and the index alone, so an entry is named
by :class:`EntryRef`.  A task carries that name in ``metadata["reasoning_gym"]``; the
``reasoning_gym`` validator rebuilds the entry from it in its own process and scores the
extracted answer with the dataset's ``score_answer``.  The name also carries a digest of
the question: a validator whose reasoning-gym builds another entry (another version) finds
out instead of scoring against the wrong answer.

reasoning-gym is imported on first use: it takes seconds, and only these domains need it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from services.domains.api import Domain, DomainError, Problem, PromptFormat, ValidatorSpec
from services.domains.formats import INSTRUCTIONS, STYLES, AnswerStyle, answer_style, answer_text
from services.domains.params import Params
from services.domains.reasoning_gym_keys import problem_key, question_digest

#: ``Task.metadata`` key of the entry's name (:meth:`EntryRef.metadata`).
METADATA: Final = "reasoning_gym"
#: Parameters this kind reads itself; every other one goes to the dataset's config.
RESERVED: Final = ("dataset", "style", "seed", "size", "max_answer_chars")
#: Distinct entries a domain draws from by default (about a fifth are held out).
DEFAULT_SIZE: Final = 1000
MAX_SIZE: Final = 1_000_000
#: Problems a task source keeps built: every one of a default-sized dataset.
CACHED_PROBLEMS: Final = 1024
#: Longest answer the validator hands to a scorer by default (the registered datasets'
#: answers are under 100 characters); longer ones score 0 unread.
DEFAULT_MAX_ANSWER_CHARS: Final = 1024

#: Datasets whose scorer would run the candidate's answer, or hang on it, in the
#: validator process: neither a domain nor a task may name them.
UNSAFE: Final[Mapping[str, str]] = {
    **dict.fromkeys(
        ("string_insertion", "spiral_matrix", "binary_matrix", "n_queens"),
        "its scorer runs eval() on the candidate's answer",
    ),
    **dict.fromkeys(
        (
            "simple_integration",
            "intermediate_integration",
            "polynomial_multiplication",
            "puzzle24",
            "countdown",
        ),
        "its scorer parses the candidate's answer with sympy's parse_expr, which runs eval()",
    ),
    "coin_flip": "its scorer builds Fraction(answer): an answer such as 1e99999999 takes minutes",
    "composite": "it mixes other datasets: declare one domain per dataset instead",
}


class DatasetError(ValueError):
    """A reasoning-gym dataset cannot be built as named (the message says why)."""


@dataclass(frozen=True, slots=True)
class DatasetRef:
    """A reasoning-gym dataset as built: its name, its own parameters, seed and size."""

    name: str
    #: The dataset's own parameters as canonical JSON (hashable, and the cache key).
    config: str
    seed: int
    size: int

    @classmethod
    def of(cls, name: str, config: Mapping[str, Any], seed: int, size: int) -> DatasetRef:
        try:
            text = json.dumps(dict(config), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise DatasetError(f"parameters are not plain values: {error}") from None
        return cls(name=name, config=text, seed=seed, size=size)

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = json.loads(self.config)
        return params


@dataclass(frozen=True, slots=True)
class EntryRef:
    """One entry of a dataset, and a digest of its question to check a rebuild by."""

    dataset: DatasetRef
    index: int
    digest: str

    def metadata(self) -> dict[str, Any]:
        ref = self.dataset
        return {
            "dataset": ref.name,
            "config": ref.params(),
            "seed": ref.seed,
            "size": ref.size,
            "index": self.index,
            "digest": self.digest,
        }

    @classmethod
    def from_metadata(cls, value: Any) -> EntryRef:
        """The entry a task names; ValueError naming the field that is wrong."""
        if not isinstance(value, dict):
            raise ValueError(f"metadata[{METADATA!r}] is not a table")
        name, config = _field(value, "dataset", str), _field(value, "config", dict)
        seed, size = _field(value, "seed", int), _field(value, "size", int)
        index, digest = _field(value, "index", int), _field(value, "digest", str)
        if not 1 <= size <= MAX_SIZE or not 0 <= index < size:
            raise ValueError(f"index {index} of size {size} is out of range (size <= {MAX_SIZE})")
        return cls(DatasetRef.of(name, config, seed, size), index, digest)


def _field(table: Mapping[str, Any], key: str, kind: type) -> Any:
    value = table.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"metadata[{METADATA!r}][{key!r}] is {value!r}, not a {kind.__name__}")
    return value


@functools.cache
def registry() -> Mapping[str, tuple[type, type]]:
    """reasoning-gym's datasets: name -> (dataset class, config class); imported once."""
    found: Mapping[str, tuple[type, type]] = importlib.import_module(
        "reasoning_gym"
    ).factory.DATASETS
    return found


def create(ref: DatasetRef) -> Any:
    """The dataset ``ref`` names (a reasoning-gym ``ProceduralDataset``); DatasetError if not."""
    if ref.name in UNSAFE:
        raise DatasetError(f"reasoning-gym dataset {ref.name!r} is refused: {UNSAFE[ref.name]}")
    known = registry()
    if ref.name not in known:
        close = difflib.get_close_matches(ref.name, list(known), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise DatasetError(f"unknown reasoning-gym dataset {ref.name!r}{hint}")
    dataset_class, config_class = known[ref.name]
    params = ref.params()
    fields = {f.name for f in dataclasses.fields(config_class)} - {"seed", "size"}
    unknown = sorted(set(params) - fields)
    if unknown:
        raise DatasetError(
            f"unknown parameters {unknown} for reasoning-gym dataset {ref.name!r} "
            f"(its parameters: {', '.join(sorted(fields)) or 'none'})"
        )
    try:
        config = config_class(**params, seed=ref.seed, size=ref.size)
        return dataset_class(config=config)
    except Exception as error:  # its own checks raise AssertionError, ValueError, TypeError
        raise DatasetError(
            f"reasoning-gym dataset {ref.name!r} rejects its parameters: "
            f"{type(error).__name__}: {error}"
        ) from None


class ReasoningGymSource:
    """Entry ``rng.randrange(size)`` of the dataset: the same entry for the same draw."""

    def __init__(self, ref: DatasetRef, dataset: Any, style: AnswerStyle) -> None:
        self.ref = ref
        self.style = style
        self._dataset = dataset
        # Held-out sets draw the same few hundred entries thousands of times: build each once.
        self.problem = functools.lru_cache(maxsize=min(ref.size, CACHED_PROBLEMS))(self._build)

    def draw(self, rng: random.Random) -> Problem:
        return self.problem(rng.randrange(self.ref.size))

    def _build(self, index: int) -> Problem:
        entry = self._dataset[index]
        question, answer = str(entry["question"]), str(entry["answer"])
        name = EntryRef(self.ref, index, question_digest(question))
        return Problem(
            key=problem_key(self.ref.name, entry),
            question=question,
            metadata={"answer": answer, METADATA: name.metadata()},
            reference=answer_text(answer, self.style),
        )


def _source(name: str, read: Params, config: Mapping[str, Any]) -> tuple[ReasoningGymSource, int]:
    dataset = read.text("dataset", "")
    if not dataset:
        raise DomainError(name, "parameter 'dataset' is required: a reasoning-gym dataset name")
    style = answer_style(read.choice("style", "tag", STYLES))
    seed = read.integer("seed", 0, 0, 2**31 - 1)
    size = read.integer("size", DEFAULT_SIZE, 1, MAX_SIZE)
    limit = read.integer("max_answer_chars", DEFAULT_MAX_ANSWER_CHARS, 1, 1_000_000)
    read.done()
    try:
        ref = DatasetRef.of(dataset, config, seed, size)
        source = ReasoningGymSource(ref, create(ref), style)
        # The first entry, built now: parameters its checks let pass can still break it.
        first = source.problem(0)
    except DatasetError as error:
        raise DomainError(name, str(error)) from None
    except Exception as error:
        raise DomainError(name, f"{dataset!r} cannot build an entry: {error!r}") from None
    if len(first.metadata["answer"]) > limit:
        raise DomainError(name, f"an answer runs over max_answer_chars ({limit}); raise it")
    return source, limit


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, {k: v for k, v in params.items() if k in RESERVED})
    config = {k: v for k, v in params.items() if k not in RESERVED}
    source, limit = _source(name, read, config)
    shown = ", ".join(f"{k}={v}" for k, v in sorted(config.items()))
    return Domain(
        name=name,
        kind="reasoning_gym",
        source=source,
        prompt=PromptFormat(system=f"Solve the task. {INSTRUCTIONS[source.style]}"),
        validators=(
            ValidatorSpec(
                kind="reasoning_gym",
                params={"extract": source.style, "max_answer_chars": limit},
            ),
        ),
        max_tokens=512,
        description=f"reasoning-gym {source.ref.name}" + (f" ({shown})" if shown else ""),
    )
