"""The terminal family's domain: its task source, prompt, tools, limits and validator."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from services.domains.api import SANDBOX_FILES, Domain, Problem, PromptFormat, ValidatorSpec
from services.domains.formats import tool_call_text
from services.domains.params import Params
from services.domains.terminal import code, data, files, logs
from services.domains.terminal.base import Made, Template

#: Templates by category; a domain serves one category or all of them.
CATEGORIES: Final[Mapping[str, Mapping[str, Template]]] = {
    "logs": logs.TEMPLATES,
    "data": data.TEMPLATES,
    "code": code.TEMPLATES,
    "files": files.TEMPLATES,
}
TEMPLATES: Final[Mapping[str, Template]] = {
    name: template for group in CATEGORIES.values() for name, template in group.items()
}
TOOLS: Final = ("bash",)
#: The judge's time: this, plus this much per turn of the trajectory it replays.
JUDGE_BASE_S: Final = 60.0
JUDGE_PER_TURN_S: Final = 15.0
SYSTEM: Final = (
    "You work in a Linux shell, in a working directory prepared for the task. Run "
    'commands with <tool_call>{"name": "bash", "arguments": {"code": "<commands>"}}'
    "</tool_call>: each call runs in a new bash in the same directory (files persist; "
    "the current directory and variables do not) and returns what the commands print. "
    "Make one call per turn. When the task is done, reply with a one-line summary and no "
    "tool call."
)


def reference(made: Made) -> str:
    """The solution as the model would write it: one bash call per command, then a summary."""
    calls = [tool_call_text("bash", {"code": command}) for command in made.solution]
    return "\n".join([*calls, "Done."])


def _sorted_items(made: Made) -> str:
    return ",".join(sorted(made.values.split(",")))


def _sorted_numbers(made: Made) -> str:
    return ",".join(map(str, sorted(int(v) for v in made.values.split(","))))


def _temporary_files(made: Made) -> str:
    return ",".join(sorted(path for path in made.files if path.endswith(".tmp")))


def _sorted_prices(made: Made) -> str:
    prices, rate = made.values.rsplit(":", 1)
    return f"{sorted(json.loads(prices))}:{rate}"


def _sorted_sides(made: Made) -> str:
    return "x".join(sorted(made.values.split("x"), key=int))


#: Templates whose drawn values carry an order the task does not have, and the values
#: in an order-free form: the same task drawn in another order must keep its key.
UNORDERED: Final[Mapping[str, Callable[[Made], str]]] = {
    # A set of file names to rename.
    "rename_extension": _sorted_items,
    # Rows joined on id and written sorted by id: the input order is no part of the task.
    "csv_join": _sorted_items,
    # Which names sit in which folder, not the order they were drawn in.
    "clean_temporary": _temporary_files,
    # The largest value of a vector.
    "cpp_wrong_result": _sorted_numbers,
    # A sum of prices, then the discount.
    "js_bug": _sorted_prices,
    # A rectangle's area and perimeter: w x h is h x w.
    "missing_function": _sorted_sides,
}


def key_values(name: str, made: Made) -> str:
    """The drawn values of template ``name`` that decide the task, in an order-free form."""
    canonical = UNORDERED.get(name)
    return made.values if canonical is None else canonical(made)


def problem(name: str, made: Made) -> Problem:
    # The drawn values can be long (whole files): the key carries their digest.
    digest = hashlib.blake2b(key_values(name, made).encode(), digest_size=8).hexdigest()
    checks = [
        {"name": c.name, "message": c.message, "probe": c.probe.to_metadata()} for c in made.checks
    ]
    return Problem(
        key=f"terminal:{name}:{digest}",
        question=made.prompt,
        metadata={SANDBOX_FILES: dict(made.files), "checks": checks, "template": name},
        reference=reference(made),
    )


@dataclass(frozen=True)
class TerminalSource:
    templates: tuple[str, ...]

    def draw(self, rng: random.Random) -> Problem:
        name = rng.choice(self.templates)
        return problem(name, TEMPLATES[name](rng))


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, params)
    category = read.choice("category", "any", ("any", *CATEGORIES))
    max_turns = read.integer("max_turns", 8, 1, 64)
    read.done()
    chosen = TEMPLATES if category == "any" else CATEGORIES[category]
    return Domain(
        name=name,
        kind="terminal",
        source=TerminalSource(tuple(chosen)),
        prompt=PromptFormat(system=SYSTEM),
        tools=TOOLS,
        validators=(
            # The judge replays every command and then the test, each up to the sandbox's
            # time limit: its own timeout leaves room for a whole trajectory.
            ValidatorSpec(
                kind="terminal",
                name="hidden_test",
                params={"timeout_s": JUDGE_BASE_S + JUDGE_PER_TURN_S * max_turns},
            ),
        ),
        # No limits of its own: the generator's sessions take the sandbox service's
        # defaults, and the judge's replay must run under the same ones (and a session
        # of default shape is served from the warm pool).
        sandbox=None,
        max_tokens=512,
        max_turns=max_turns,
        description=f"terminal tasks ({category}, {len(chosen)} templates) over bash calls",
    )
