"""Tool use: questions that are easy with the sandboxed ``python`` tool and hard without.

The generator runs the model's tool calls in the sandbox (the domain declares the
tool and its sandbox limits); the validators check the final answer and that the
tool calls were well formed.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from protocol.messages import ChatMessage, SandboxLimits
from services.domains.api import Domain, Problem, PromptFormat, ValidatorSpec
from services.domains.formats import INSTRUCTIONS, answer_text, tool_call_text, tool_instructions
from services.domains.params import Params

TOOLS: Final = ("python",)

#: (key values, question, answer, python code that prints the answer) at a difficulty level.
#: The key values name the problem whatever its wording and level: values whose order does
#: not change the answer come sorted.
Made = tuple[str, str, str, str]


def _sha(rng: random.Random, level: int) -> Made:
    word = "".join(rng.choice(string.ascii_lowercase) for _ in range(3 + 3 * level))
    answer = hashlib.sha256(word.encode()).hexdigest()[:12]
    question = f"What are the first 12 hex digits of the SHA-256 digest of the string '{word}'?"
    code = f"import hashlib; print(hashlib.sha256({word!r}.encode()).hexdigest()[:12])"
    return word, question, answer, code


def _modpow(rng: random.Random, level: int) -> Made:
    base, exponent = rng.randint(2, 10**level * 10), rng.randint(10, 10 ** (level + 2))
    modulus = rng.randint(10**level, 10 ** (level + 3))
    question = f"What is {base} to the power {exponent}, modulo {modulus}?"
    return (
        f"{base},{exponent},{modulus}",
        question,
        str(pow(base, exponent, modulus)),
        (f"print(pow({base}, {exponent}, {modulus}))"),
    )


def _primes(rng: random.Random, level: int) -> Made:
    limit = rng.randint(10 ** (level + 1), 10 ** (level + 2))
    sieve = bytearray([1]) * limit
    sieve[0] = sieve[1] = 0
    for i in range(2, math.isqrt(limit - 1) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, limit, i)))
    code = f"print(sum(all(n % d for d in range(2, int(n ** 0.5) + 1)) for n in range(2, {limit})))"
    return str(limit), f"How many prime numbers are smaller than {limit}?", str(sum(sieve)), code


def _median(rng: random.Random, level: int) -> Made:
    # An odd count: the median is one of the values, an integer.
    values = [rng.randint(-1000, 1000) for _ in range(9 + 10 * level)]
    question = f"What is the median of these numbers: {values}?"
    code = f"import statistics; print(statistics.median({values}))"
    # The same numbers in another order have the same median: one problem.
    key = ",".join(map(str, sorted(values)))
    return key, question, str(statistics.median(values)), code


def _factorial_digits(rng: random.Random, level: int) -> Made:
    n = rng.randint(20 * level, 60 * level)
    answer = str(sum(int(d) for d in str(math.factorial(n))))
    question = f"What is the sum of the decimal digits of {n}! ({n} factorial)?"
    code = f"import math; print(sum(int(d) for d in str(math.factorial({n}))))"
    return str(n), question, answer, code


PUZZLES: Final[dict[str, Callable[[random.Random, int], Made]]] = {
    "sha": _sha,
    "modpow": _modpow,
    "primes": _primes,
    "median": _median,
    "factorial_digits": _factorial_digits,
}


@dataclass(frozen=True)
class ToolSource:
    puzzles: tuple[str, ...]
    level: int
    #: Share of the problems whose reference shows a failed call and its fix first.
    recovery: float = 0.0
    #: Every problem's context already holds a failed call and its error (a recovery probe).
    failed_first: bool = False

    def draw(self, rng: random.Random) -> Problem:
        name = rng.choice(self.puzzles)
        values, question, answer, code = PUZZLES[name](rng, self.level)
        key = f"tool:{name}:{values}"
        call = tool_call_text("python", {"code": code})
        # The reference code prints the answer: what the sandbox's python returns.
        calls, outputs = [call], [f"{answer}\n"]
        if self.failed_first:
            return Problem(
                key=key,
                question=question,
                metadata={"answer": answer},
                reference="\n".join([call, answer_text(answer, "tag")]),
                tool_outputs=tuple(outputs),
                turns=_failed_call(code),
            )
        if _shows_recovery(key, self.recovery):
            broken = tool_call_text("python", {"code": _misspelt(code)})
            calls.insert(0, broken)
            outputs.insert(0, f"\n{NAME_ERROR}")
        return Problem(
            key=key,
            question=question,
            metadata={"answer": answer},
            reference="\n".join([*calls, answer_text(answer, "tag")]),
            tool_outputs=tuple(outputs),
        )


def _shows_recovery(key: str, share: float) -> bool:
    """Whether the problem's reference recovers from an error: by its key, so the draws
    (and the splits) are those of the same domain without recovery."""
    if share <= 0.0:
        return False
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") / 2**32
    return bucket < share


def _failed_call(code: str) -> tuple[ChatMessage, ChatMessage]:
    """The call with ``print`` misspelt and the sandbox's answer, as the chat holds them."""
    broken = tool_call_text("python", {"code": _misspelt(code)})
    return (
        ChatMessage(role="assistant", content=broken),
        ChatMessage(role="tool", content=f"\n{NAME_ERROR}"),
    )


def with_recovery(domain: Domain, share: float) -> Domain | None:
    """``domain`` with ``share`` of its references showing a failed call and its fix first
    (same problems, same splits); None when its references have no tool call to fail."""
    if not isinstance(domain.source, ToolSource):
        return None
    return replace(domain, source=replace(domain.source, recovery=share))


def _misspelt(code: str) -> str:
    """A slip the policy makes: a name misspelt (``print`` as ``prnt``)."""
    if "print(" not in code:
        raise ValueError(f"no print( to misspell in {code!r}")
    return code.replace("print(", "prnt(", 1)


#: What the sandbox's python prints for a misspelt ``print`` on the first line (its agent
#: compiles the code as ``<sandbox>``, so no source line is shown; Python names the fix).
NAME_ERROR: Final = (
    "Traceback (most recent call last):\n"
    '  File "<sandbox>", line 1, in <module>\n'
    "NameError: name 'prnt' is not defined. Did you mean: 'print'?\n"
)


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, params)
    puzzle = read.choice("task", "any", ("any", *PUZZLES))
    level = read.integer("difficulty", 1, 1, 3)
    recovery = read.number("recovery", 0.0, 0.0, 1.0)
    failed_first = read.flag("failed_first", False)
    read.done()
    return Domain(
        name=name,
        kind="tool_use",
        source=ToolSource(
            tuple(PUZZLES) if puzzle == "any" else (puzzle,), level, recovery, failed_first
        ),
        prompt=PromptFormat(system=f"{tool_instructions(TOOLS)} {INSTRUCTIONS['tag']}"),
        tools=TOOLS,
        validators=(
            ValidatorSpec(kind="exact", weight=0.8, params={"extract": "tag"}),
            ValidatorSpec(kind="tool_call", weight=0.2, params={"min_calls": 1}),
        ),
        sandbox=SandboxLimits(timeout_s=10.0, memory_mb=256),
        max_tokens=512,
        max_turns=4,
        description=f"{puzzle} puzzles at difficulty {level}, with a python tool",
    )
