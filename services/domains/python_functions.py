"""Python functions with unit tests, judged by running them in the sandbox.

A problem is one function of :mod:`services.domains.python_bank` in one variant;
its tests are calls whose expected values come from running the reference
implementation here, so the reference and the tests cannot drift apart; the calls go to
the sandbox, the expected values stay with the validator.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from protocol.messages import SandboxLimits
from services.domains.api import Domain, Problem, PromptFormat, ValidatorSpec
from services.domains.params import Params
from services.domains.python_bank import CATEGORIES, SPECS, FunctionSpec

SYSTEM: Final = (
    "Write the Python function described. Reply with one ```python code block that "
    "defines it, using only the standard library. Do not print anything."
)


def reference_function(spec: FunctionSpec, variant: int) -> Callable[..., Any]:
    """The reference implementation, built from the very text handed out as the reference."""
    namespace: dict[str, Any] = {}
    # Trusted, in-repo source (python_bank): never model output.
    exec(spec.reference.replace("{k}", str(variant)), namespace)
    function: Callable[..., Any] = namespace[spec.name]
    return function


def call_text(name: str, args: tuple[Any, ...]) -> str:
    return f"{name}({', '.join(repr(arg) for arg in args)})"


def scored_and_shown(draw: Callable[[], Any], count: int) -> tuple[list[Any], Any]:
    """``count`` inputs to score and one more to show in the prompt, never among them:
    hard-coding the prompt's example earns nothing.  A tiny input space may leave fewer
    than ``count`` scored inputs (those equal to the example are dropped), never none."""
    cases = [draw() for _ in range(count)]
    shown = draw()
    for _ in range(100):
        if shown not in cases:
            break
        shown = draw()
    return [case for case in cases if case != shown] or cases, shown


@dataclass(frozen=True)
class FunctionSource:
    specs: tuple[FunctionSpec, ...]
    tests: int
    #: Problems built so far, by key: a key is one problem, and building one executes its
    #: reference on every input (a held-out set draws thousands of a few dozen keys).
    built: dict[str, Problem] = field(default_factory=dict, compare=False, repr=False)

    def draw(self, rng: random.Random) -> Problem:
        spec = rng.choice(self.specs)
        variant = rng.choice(spec.variants)
        key = f"py:{spec.name}:{variant}"
        if key not in self.built:
            self.built[key] = self._build(spec, variant, key)
        return self.built[key]

    def _build(self, spec: FunctionSpec, variant: int, key: str) -> Problem:
        function = reference_function(spec, variant)
        # Inputs follow from the key alone: one key is one problem, whatever the caller's rng.
        inputs = random.Random(key)
        cases, shown = scored_and_shown(lambda: spec.inputs(inputs, variant), self.tests)
        example = f"{call_text(spec.name, shown)} == {function(*shown)!r}"
        question = (
            f"Write `{spec.signature}`: {spec.description.replace('{k}', str(variant))}.\n"
            f"Example: {example}"
        )
        code = spec.reference.replace("{k}", str(variant))
        metadata = {
            "entry_point": spec.name,
            "calls": [call_text(spec.name, args) for args in cases],
            "expected": [repr(function(*args)) for args in cases],
        }
        return Problem(
            key=key, question=question, metadata=metadata, reference=f"```python\n{code}```"
        )


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, params)
    category = read.choice("category", "any", CATEGORIES)
    difficulty = read.integer("difficulty", 3, 1, 3)
    tests = read.integer("tests", 5, 1, 50)
    timeout_s = read.number("timeout_s", 5.0, 0.1, 120.0)
    read.done()
    specs = tuple(
        s for s in SPECS if category in ("any", s.category) and s.difficulty <= difficulty
    )
    return Domain(
        name=name,
        kind="python_functions",
        source=FunctionSource(specs=specs, tests=tests),
        prompt=PromptFormat(system=SYSTEM),
        validators=(ValidatorSpec(kind="code", name="unit_tests"),),
        sandbox=SandboxLimits(timeout_s=timeout_s, memory_mb=256, pids=64),
        max_tokens=512,
        description=f"{category} functions up to difficulty {difficulty}, {tests} tests each",
    )
