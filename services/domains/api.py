"""The domain plugin API: what a domain is, and how it turns into protocol Tasks.

A domain is plain data plus a task source.  It never imports a validator: the
generator only needs to know a domain exists and what its prompts look like;
the validator service turns each :class:`ValidatorSpec` into a judge.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, runtime_checkable

from protocol import subjects
from protocol.errors import SubjectError
from protocol.messages import (
    DEFAULT_TIER,
    TIERS,
    ChatMessage,
    SamplingParams,
    SandboxLimits,
    Task,
)
from services.domains.retry import RetryPolicy

Split = Literal["train", "eval"]
#: What training does with a sample cut at the token limit: train on it as it is
#: (``keep``), or leave it out of the loss (``filter``, DAPO's overlong filtering: a
#: rollout that never stopped teaches nothing about stopping, and its reward, earned by
#: an answer early in it, would otherwise reinforce running on).
Overlong = Literal["keep", "filter"]
OVERLONG: Final[tuple[Overlong, ...]] = ("keep", "filter")
SPLITS: Final[tuple[Split, ...]] = ("train", "eval")
#: Longest task id the protocol accepts (ids are subject tokens).
_MAX_ID: Final = 128
#: Draws per wanted task before a split is declared too small to fill.
_DRAWS_PER_TASK: Final = 200
#: ``Task.metadata`` key of the files (relative path -> text) that a task's tool
#: sandbox session starts with: the generator opens each trajectory's session with them.
SANDBOX_FILES: Final = "sandbox_files"


class DomainError(ValueError):
    """A domain is declared wrongly (config file, plugin, parameters)."""

    def __init__(self, domain: str, message: str) -> None:
        super().__init__(f"domain {domain!r}: {message}")
        self.domain = domain
        self.message = message


class UnknownDomain(LookupError):
    """No domain of that name is registered."""

    def __init__(self, name: str, known: int) -> None:
        super().__init__(f"unknown domain {name!r} ({known} domains are registered)")
        self.name = name
        self.known = known


@dataclass(frozen=True, kw_only=True)
class ValidatorSpec:
    """One judge of a domain: its kind (``math``, ``code``, ...), weight and parameters."""

    kind: str
    weight: float = 1.0
    params: Mapping[str, Any] = field(default_factory=dict)
    #: Name in ``ValidatorDetail.name``; defaults to the kind.
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or self.kind


@dataclass(frozen=True, kw_only=True)
class PromptFormat:
    """A system prompt plus a user template with one ``{question}`` field."""

    system: str = ""
    template: str = "{question}"

    def messages(self, question: str) -> list[ChatMessage]:
        user = ChatMessage(role="user", content=self.template.format(question=question))
        if not self.system:
            return [user]
        return [ChatMessage(role="system", content=self.system), user]


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One problem drawn from a task source."""

    #: Identity of the problem: equal keys are the same problem, and the key decides its split.
    key: str
    question: str
    #: Reference data for the validators (``answer``, ``tests``, ``document``, ...).
    metadata: Mapping[str, Any]
    #: A completion that earns the full reward (tests, benchmarks, sanity checks).
    reference: str = ""
    #: A dataset may fix the split itself; otherwise it follows from the key.
    split: Split | None = None
    #: What each tool call of ``reference`` prints, in order.  A warm-up on the reference
    #: then shows the policy each output where the agent loop puts it, and the answer after
    #: it: without them it would learn to answer before the tool has said anything.
    tool_outputs: tuple[str, ...] = ()
    #: Turns already in the context after the question (a probe's failed tool call and the
    #: error it got); the policy writes the next assistant turn.
    turns: tuple[ChatMessage, ...] = ()


class TaskSource(Protocol):
    """Where a domain's problems come from: a generator, or a dataset drawn at random."""

    def draw(self, rng: random.Random) -> Problem: ...


@runtime_checkable
class Respells(Protocol):
    """A source that can write one of its problems another way: the same key and answer,
    another question (``4+9+3`` as ``3+4+9``)."""

    def respell(self, problem: Problem, rng: random.Random) -> Problem: ...


@dataclass(frozen=True, kw_only=True)
class Example:
    """A task with a completion that earns the full reward."""

    task: Task
    reference: str
    #: ``Problem.tool_outputs`` of the reference's tool calls.
    tool_outputs: tuple[str, ...] = ()


def is_heldout(task: Task) -> bool:
    """A task of an eval split: evaluated, never trained on (nor held back for training)."""
    return task.metadata.get("split") == "eval"


def in_eval(key: str, eval_fraction: float) -> bool:
    """Deterministic split by a hash of the key: the same problem is eval in every domain."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < eval_fraction


@dataclass(frozen=True, kw_only=True)
class Domain:
    """Everything Temper knows about one task domain."""

    name: str
    source: TaskSource = field(compare=False)
    validators: tuple[ValidatorSpec, ...]
    prompt: PromptFormat = field(default_factory=PromptFormat)
    tools: tuple[str, ...] = ()
    #: Limits for the domain's sandbox work (unit tests, tool calls); ``None``: service defaults.
    sandbox: SandboxLimits | None = None
    eval_fraction: float = 0.2
    max_tokens: int = 256
    max_turns: int = 1
    #: GRPO group size: each task is sampled this many times.
    samples: int = 1
    tier: int = DEFAULT_TIER
    #: A scored rollout "passes" when its reward reaches this (per-domain pass rate).
    pass_threshold: float = 1.0
    #: Weight of the domain in the generators' fair share within its tier: with tasks of
    #: several domains waiting, each gets starts in proportion to its weight.
    share_weight: float = 1.0
    #: How the generator retries the domain's failed samples.
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    overlong: Overlong = "keep"
    #: The family or built-in kind that made the domain (``arithmetic``, ``jsonl``, ...).
    kind: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        try:
            subjects.token(self.name, "domain name")
        except SubjectError as error:
            raise DomainError(str(self.name), error.message) from None
        self._check_numbers()
        if not self.validators:
            raise DomainError(self.name, "declares no validators")
        for spec in self.validators:
            if not math.isfinite(spec.weight):
                raise DomainError(self.name, f"validator {spec.label!r} has weight {spec.weight}")

    def _check_numbers(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise DomainError(self.name, f"eval_fraction {self.eval_fraction} is not in [0, 1)")
        if not 0 <= self.tier < TIERS:
            raise DomainError(self.name, f"tier {self.tier} is outside 0..{TIERS - 1}")
        for what, value in (("max_tokens", self.max_tokens), ("max_turns", self.max_turns)):
            if value < 1:
                raise DomainError(self.name, f"{what} must be at least 1, not {value}")
        if not 1 <= self.samples <= 4096:
            raise DomainError(self.name, f"samples {self.samples} is outside 1..4096")
        if self.overlong not in OVERLONG:
            raise DomainError(self.name, f"overlong {self.overlong!r} is not one of {OVERLONG}")
        if not (math.isfinite(self.share_weight) and self.share_weight > 0):
            raise DomainError(self.name, f"share_weight {self.share_weight} is not positive")

    def respelled(self, problem: Problem, rng: random.Random) -> Problem:
        """``problem`` written another way when the source knows how; else as drawn."""
        if isinstance(self.source, Respells):
            return self.source.respell(problem, rng)
        return problem

    def split_of(self, problem: Problem) -> Split:
        if problem.split is not None:
            return problem.split
        return "eval" if in_eval(problem.key, self.eval_fraction) else "train"

    def problems(self, n: int, split: Split = "train", seed: int = 0) -> list[Problem]:
        """``n`` problems of ``split``, the same ones for the same seed (repeats allowed)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        found = list(itertools.islice(self.drawn(n, split, seed), n))
        if len(found) == n:
            return found
        raise DomainError(self.name, f"found {len(found)} of {n} {split} problems; split too small")

    def drawn(self, n: int, split: Split = "train", seed: int = 0) -> Iterator[Problem]:
        """The problems of ``split`` in draw order, as :meth:`problems` takes them, for a
        caller that may stop early; it ends after the draws that ``n`` problems are
        allowed (rejection sampling, bounded: a split with no problems must end, not spin)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        rng = random.Random(f"{self.name}:{split}:{seed}")
        for _ in range(n * _DRAWS_PER_TASK + _DRAWS_PER_TASK):
            problem = self.source.draw(rng)
            if self.split_of(problem) == split:
                yield problem

    def examples(self, n: int, split: Split = "train", seed: int = 0) -> list[Example]:
        problems = self.problems(n, split, seed)
        return [
            Example(
                task=self.task(p, split, seed, i),
                reference=p.reference,
                tool_outputs=p.tool_outputs,
            )
            for i, p in enumerate(problems)
        ]

    def make_tasks(self, n: int, split: Split = "train", seed: int = 0) -> list[Task]:
        """``n`` tasks of ``split``; deterministic in ``seed``; eval never overlaps train."""
        return [example.task for example in self.examples(n, split, seed)]

    def task(self, problem: Problem, split: Split, seed: int, index: int) -> Task:
        metadata = {**problem.metadata, "key": problem.key, "split": split}
        if self.overlong != "keep":
            metadata["overlong"] = self.overlong
        return Task(
            id=task_id(self.name, split, seed, index),
            domain=self.name,
            tier=self.tier,
            prompt=[*self.prompt.messages(problem.question), *problem.turns],
            tools=list(self.tools),
            sampling=SamplingParams(max_tokens=self.max_tokens),
            n=self.samples,
            max_turns=self.max_turns,
            metadata=metadata,
        )


def task_id(name: str, *parts: object) -> str:
    """``name-part-...-part``, a valid task id (a subject token and a message id).

    Over the id limit (long family names), a readable prefix of the name and a digest of
    the whole id keep it unique, and the last part stays readable."""
    full = "-".join([name, *map(str, parts)])
    if len(full) <= _MAX_ID:
        return full
    digest = hashlib.blake2b(full.encode(), digest_size=8).hexdigest()
    return f"{name[:80]}-{digest}-{parts[-1] if parts else ''}"[:_MAX_ID]
