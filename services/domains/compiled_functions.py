"""C++ and JavaScript functions with unit tests, judged by building and running them.

The sibling of :mod:`services.domains.python_functions`: a problem is one function of
:mod:`services.domains.compiled_bank` in one variant; its tests are calls in the
problem's language whose expected values come from the Python reference (the calls go to
the sandbox, the expected values stay with the validator).  A candidate that does not
compile passes no test (the compiler's message goes into the score's details); a sandbox
failure is an infrastructure failure.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from protocol.messages import SandboxLimits
from services.domains.api import Domain, Problem, PromptFormat, ValidatorSpec
from services.domains.compiled_bank import SPECS, CompiledSpec, call_expression, test_expression
from services.domains.params import Params
from services.domains.python_functions import scored_and_shown

LANGUAGES: Final = ("cpp", "js")
SYSTEM: Final = {
    "cpp": (
        "Write the C++17 function described. Reply with one ```cpp code block that defines "
        "it; the standard library headers are already included. No main, no output."
    ),
    "js": (
        "Write the JavaScript function described. Reply with one ```js code block that "
        "defines it as a plain function declaration. No output, no modules."
    ),
}


@dataclass(frozen=True)
class CompiledSource:
    language: str
    specs: tuple[CompiledSpec, ...]
    tests: int

    def draw(self, rng: random.Random) -> Problem:
        spec = rng.choice(self.specs)
        variant = rng.choice(spec.variants)
        key = f"{self.language}:{spec.name}:{variant}"
        # Inputs follow from the key alone: one key is one problem, whatever the caller's rng.
        inputs = random.Random(key)
        cases, shown = scored_and_shown(lambda: spec.inputs(inputs), self.tests)
        example = test_expression(self.language, spec.name, shown, spec.python(*shown, variant))
        signature = spec.cpp_signature if self.language == "cpp" else spec.js_signature
        description = spec.description.replace("{k}", str(variant))
        code = (spec.cpp if self.language == "cpp" else spec.js).replace("{k}", str(variant))
        metadata = {
            "entry_point": spec.name,
            "language": self.language,
            "calls": [call_expression(self.language, spec.name, args) for args in cases],
            "expected": [repr(spec.python(*args, variant)) for args in cases],
        }
        return Problem(
            key=key,
            question=f"Write `{signature}`: {description}.\nTest: {example}",
            metadata=metadata,
            reference=f"```{self.language}\n{code}```",
        )


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, params)
    language = read.choice("language", "cpp", LANGUAGES)
    tests = read.integer("tests", 5, 1, 50)
    timeout_s = read.number("timeout_s", 20.0, 0.1, 120.0)
    read.done()
    return Domain(
        name=name,
        kind="compiled_functions",
        source=CompiledSource(language=language, specs=SPECS, tests=tests),
        prompt=PromptFormat(system=SYSTEM[language]),
        validators=(ValidatorSpec(kind="code", name="unit_tests", params={"language": language}),),
        # A compiler (or node) needs more than a Python run: the sandbox's language
        # defaults, with the domain's own time limit.
        sandbox=SandboxLimits(timeout_s=timeout_s),
        max_tokens=512,
        description=f"{language} functions, {tests} tests each",
    )
