"""From a domain's ValidatorSpecs to validators.

Each kind reads its parameters from the spec (unknown ones are an error naming
the domain).  Plugins add kinds through the ``temper.validators`` entry-point
group, or a spec's kind may be ``module:factory`` itself; a factory takes
``(params, domain, resources)`` like the built-in ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Final

from protocol.messages import SandboxLimits
from services.domains import reasoning_gym as rg
from services.domains.api import Domain, DomainError, ValidatorSpec
from services.domains.harbor_domain import HarborSource
from services.domains.params import Params
from services.domains.ranges import SCORE_RANGE
from services.domains.registry import resolve
from services.validator import rules
from services.validator.base import Validator
from services.validator.cad import CadPart
from services.validator.code import UnitTests
from services.validator.documents.judge import DocumentCache, DocumentFileQA
from services.validator.extract import EXTRACT_MODES, Extract
from services.validator.harbor import HarborVerifier
from services.validator.reasoning_gym import ReasoningGymScore
from services.validator.reward_model import RewardBatcher, RewardModel, RewardModelScore
from services.validator.sandbox import Sandbox
from services.validator.sessions import Sessions
from services.validator.settings import PreviewMode
from services.validator.terminal import HiddenTest

ENTRY_POINT_GROUP: Final = "temper.validators"


@dataclass
class RewardModels:
    """One batcher per model directory, shared by every domain that names it."""

    max_batch: int = 16
    max_wait_s: float = 0.01
    load: Callable[[Path, int], Callable[[Any], list[float]]] = RewardModel
    batchers: dict[tuple[Path, int], RewardBatcher] = field(default_factory=dict)

    def get(self, path: Path, max_length: int) -> RewardBatcher:
        key = (path.resolve(), max_length)
        if key not in self.batchers:
            self.batchers[key] = RewardBatcher(self.load(*key), self.max_batch, self.max_wait_s)
        return self.batchers[key]


@dataclass(frozen=True)
class Resources:
    """What validators share: the sandbox connection, the reward models, default limits."""

    sandbox: Sandbox | None = None
    #: Sandbox sessions, for judges that replay a multi-step task (``terminal``).
    sessions: Sessions | None = None
    reward_models: RewardModels = field(default_factory=RewardModels)
    sandbox_timeout_s: float = 30.0
    sandbox_grace_s: float = 5.0
    #: Which rendered CAD parts get a PNG preview (``heldout``, ``all``, ``off``).
    cad_previews: PreviewMode = "heldout"


Factory = Callable[[Params, Domain, Resources], Validator]


def _extract(params: Params) -> Extract:
    mode = params.choice("extract", "auto", EXTRACT_MODES)
    return next(m for m in EXTRACT_MODES if m == mode)


def _exact(params: Params, domain: Domain, resources: Resources) -> Validator:
    return rules.ExactMatch(
        extract=_extract(params),
        case_sensitive=params.flag("case_sensitive", False),
        normalized=params.flag("normalize", True),
        answer_key=params.text("answer_key", "answer"),
    )


def _math(params: Params, domain: Domain, resources: Resources) -> Validator:
    return rules.MathAnswer(
        extract=_extract(params),
        rel_tol=params.number("rel_tol", 1e-6, 0.0, 1.0),
        abs_tol=params.number("abs_tol", 1e-9, 0.0, 1e12),
        answer_key=params.text("answer_key", "answer"),
    )


def _format(params: Params, domain: Domain, resources: Resources) -> Validator:
    pattern = params.text("pattern", "")
    try:
        compiled = re.compile(pattern, re.DOTALL) if pattern else None
    except re.error as error:
        raise DomainError(domain.name, f"format pattern {pattern!r}: {error}") from None
    return rules.FormatCheck(
        pattern=compiled,
        fullmatch=params.flag("fullmatch", False),
        required_tags=params.texts("tags", ()),
        boxed=params.flag("boxed", False),
    )


def _tool_call(params: Params, domain: Domain, resources: Resources) -> Validator:
    return rules.ToolCallFormat(
        min_calls=params.integer("min_calls", 1, 0, 1000),
        known_tools_only=params.flag("known_tools_only", True),
    )


def _length(params: Params, domain: Domain, resources: Resources) -> Validator:
    unit = params.choice("unit", "chars", ("chars", "tokens"))
    limit = params.integer("limit", 2000 if unit == "chars" else domain.max_tokens, 1, 10**9)
    hard = params.integer("hard", 2 * limit, limit + 1, 10**9)
    truncated = params.number("truncated", 1.0, 0.0, 1.0)
    return rules.LengthPenalty(limit=limit, hard=hard, unit=unit, truncated=truncated)


def _doc_qa(params: Params, domain: Domain, resources: Resources) -> Validator:
    return rules.DocNumericQA(
        rel_tol=params.number("rel_tol", 0.005, 0.0, 1.0),
        abs_tol=params.number("abs_tol", 0.01, 0.0, 1e12),
        max_citation_chars=params.integer("max_citation_chars", 400, 1, 1_000_000),
    )


def _doc_file(params: Params, domain: Domain, resources: Resources) -> Validator:
    cache_dir = params.text("cache_dir", "")
    return DocumentFileQA(
        rel_tol=params.number("rel_tol", 0.005, 0.0, 1.0),
        abs_tol=params.number("abs_tol", 0.01, 0.0, 1e12),
        cache=DocumentCache(
            size=params.integer("cache_size", 32, 1, 100_000),
            directory=Path(cache_dir) if cache_dir else None,
        ),
    )


def _code(params: Params, domain: Domain, resources: Resources) -> Validator:
    if resources.sandbox is None:
        raise DomainError(domain.name, "the code validator needs a sandbox connection")
    return UnitTests(
        sandbox=resources.sandbox,
        limits=domain.sandbox or SandboxLimits(),
        grace_s=resources.sandbox_grace_s,
        default_timeout_s=resources.sandbox_timeout_s,
        language=params.choice("language", "python", ("python", "cpp", "js")),
    )


def _cad(params: Params, domain: Domain, resources: Resources) -> Validator:
    if resources.sandbox is None:
        raise DomainError(domain.name, "the cad validator needs a sandbox connection")
    return CadPart(
        sandbox=resources.sandbox,
        limits=domain.sandbox or SandboxLimits(),
        grace_s=resources.sandbox_grace_s,
        default_timeout_s=resources.sandbox_timeout_s,
        previews=resources.cad_previews,
    )


def _terminal(params: Params, domain: Domain, resources: Resources) -> Validator:
    if resources.sessions is None:
        raise DomainError(domain.name, "the terminal validator needs sandbox sessions")
    return HiddenTest(sessions=resources.sessions, limits=domain.sandbox or SandboxLimits())


def _harbor(params: Params, domain: Domain, resources: Resources) -> Validator:
    if resources.sessions is None:
        raise DomainError(domain.name, "the harbor validator needs sandbox sessions")
    if not isinstance(domain.source, HarborSource):
        raise DomainError(domain.name, "the harbor validator judges a harbor domain's tasks only")
    return HarborVerifier(sessions=resources.sessions, problems=domain.source.by_key)


def _reward_model(params: Params, domain: Domain, resources: Resources) -> Validator:
    path = params.text("path", "")
    if not path:
        raise DomainError(domain.name, "the reward_model validator needs a `path` parameter")
    batcher = resources.reward_models.get(
        Path(path), params.integer("max_length", 1024, 8, 1 << 17)
    )
    transform = params.choice("transform", "sigmoid", ("sigmoid", "raw"))
    return RewardModelScore(
        batcher=batcher,
        transform="raw" if transform == "raw" else "sigmoid",
        include_prompt=params.flag("include_prompt", True),
    )


def _reasoning_gym(params: Params, domain: Domain, resources: Resources) -> Validator:
    judge = ReasoningGymScore(
        extract=_extract(params),
        max_answer_chars=params.integer(
            "max_answer_chars", rg.DEFAULT_MAX_ANSWER_CHARS, 1, 1_000_000
        ),
    )
    rg.registry()  # imported now, while the service starts, not on its first rollout
    return judge


KINDS: Final[Mapping[str, Factory]] = {
    "exact": _exact,
    "math": _math,
    "format": _format,
    "tool_call": _tool_call,
    "length": _length,
    "doc_qa": _doc_qa,
    "doc_file": _doc_file,
    "code": _code,
    "cad": _cad,
    "terminal": _terminal,
    "harbor": _harbor,
    "reward_model": _reward_model,
    "reasoning_gym": _reasoning_gym,
}


def plugin_kinds() -> dict[str, str]:
    """Validator kinds of installed plugins: name -> ``module:factory``."""
    return {point.name: point.value for point in entry_points(group=ENTRY_POINT_GROUP)}


def factory(kind: str, plugins: Mapping[str, str]) -> Factory:
    if kind in KINDS:
        return KINDS[kind]
    target = plugins.get(kind, kind)
    if ":" not in target:
        raise LookupError(f"unknown validator kind {kind!r} (built-in: {', '.join(KINDS)})")
    found = resolve(target)
    if not callable(found):
        raise LookupError(f"validator kind {target!r} is not callable")
    return found  # type: ignore[no-any-return]


def build(
    spec: ValidatorSpec, domain: Domain, resources: Resources, plugins: Mapping[str, str]
) -> Validator:
    """The validator ``spec`` describes, for ``domain``; raises DomainError if it is wrong."""
    try:
        make = factory(spec.kind, plugins)
    except (LookupError, ImportError, ValueError) as error:
        raise DomainError(domain.name, str(error)) from None
    # Read by the service for every kind, not by the kind's factory.
    service_params = ("timeout_s", SCORE_RANGE)
    params = Params(domain.name, {k: v for k, v in spec.params.items() if k not in service_params})
    validator = make(params, domain, resources)
    params.done()
    return validator


def timeout_of(spec: ValidatorSpec, default_s: float) -> float:
    """A spec's own ``timeout_s`` parameter, else the service's per-validator timeout."""
    value = spec.params.get("timeout_s", default_s)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise DomainError(spec.label, f"timeout_s must be a positive number, not {value!r}")
    return float(value)
