"""Arithmetic: ``3+4=`` -> ``<answer>7</answer>``.

Small enough for a tiny policy to learn (the learning demo uses the built-in
``arithmetic`` domain: single-digit addition), and parameterised into families
(operator x digits x terms x answer style) by the config file.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from services.domains.api import Domain, Problem, PromptFormat, ValidatorSpec
from services.domains.formats import (
    INSTRUCTIONS,
    STYLES,
    AnswerStyle,
    answer_style,
    answer_text,
)
from services.domains.params import Params

OPS: Final = ("add", "sub", "mul", "div", "mixed")
_SYMBOL: Final = {"add": "+", "sub": "-", "mul": "*"}


def evaluate(operands: Sequence[int], operators: Sequence[str]) -> int:
    """Value of ``a op b op c ...`` with ``*`` binding tighter than ``+`` and ``-``."""
    total, term, sign = 0, operands[0], 1
    for operator, operand in zip(operators, operands[1:], strict=True):
        if operator == "*":
            term *= operand
            continue
        total += sign * term
        sign, term = (1 if operator == "+" else -1), operand
    return total + sign * term


def written(operands: Sequence[int], operators: Sequence[str]) -> str:
    """``a op b op c ...`` as the prompt shows it."""
    return str(operands[0]) + "".join(
        f"{o}{x}" for o, x in zip(operators, operands[1:], strict=True)
    )


def canonical(operands: Sequence[int], operators: Sequence[str]) -> str:
    """One spelling of ``a op b op c ...`` for every reordering that + and * allow.

    Each product's factors are sorted, then the added terms and the subtracted terms
    each: ``4+9+3`` and ``3+9+4`` are one problem, ``a-b+c`` and ``a+c-b`` too, while
    ``3-4`` and ``4-3`` (or ``2*3+4`` and ``2+3*4``) stay two.  The split hashes this,
    so a held-out problem is never a reordering of a trained one.
    """
    if len(operators) != len(operands) - 1:
        raise ValueError(f"{len(operands)} operands need {len(operands) - 1} operators")
    added: list[tuple[int, ...]] = []
    subtracted: list[tuple[int, ...]] = []
    factors, into = [operands[0]], added
    for operator, operand in zip(operators, operands[1:], strict=True):
        if operator == "*":
            factors.append(operand)
            continue
        if operator not in ("+", "-"):
            raise ValueError(f"operator {operator!r} is not one of +, -, *")
        into.append(tuple(sorted(factors)))
        factors, into = [operand], (added if operator == "+" else subtracted)
    into.append(tuple(sorted(factors)))
    plus = "+".join(_product(term) for term in sorted(added))
    return plus + "".join(f"-{_product(term)}" for term in sorted(subtracted))


def _product(factors: tuple[int, ...]) -> str:
    return "*".join(map(str, factors))


def parsed(expression: str) -> tuple[list[int], list[str]]:
    """Operands and operators of an expression as :func:`written` writes it."""
    tokens = re.findall(r"\d+|[-+*]", expression)
    if "".join(tokens) != expression or len(tokens) % 2 == 0:
        raise ValueError(f"{expression!r} is not a chain of numbers and + - *")
    return [int(t) for t in tokens[::2]], tokens[1::2]


def respelled(operands: Sequence[int], operators: Sequence[str], rng: random.Random) -> str:
    """The same sum of products in another order: each product's factors shuffled, and
    the terms too, an added one first.  Its :func:`canonical` form and value are the same."""
    terms: list[tuple[str, list[int]]] = [("+", [operands[0]])]
    for operator, operand in zip(operators, operands[1:], strict=True):
        if operator == "*":
            terms[-1][1].append(operand)
        else:
            terms.append((operator, [operand]))
    for _, factors in terms:
        rng.shuffle(factors)
    rng.shuffle(terms)
    first = next(i for i, (sign, _) in enumerate(terms) if sign == "+")
    terms.insert(0, terms.pop(first))
    text = _product(tuple(terms[0][1]))
    return text + "".join(f"{sign}{_product(tuple(factors))}" for sign, factors in terms[1:])


@dataclass(frozen=True)
class ArithmeticSource:
    op: str
    digits: int
    terms: int
    style: AnswerStyle

    def draw(self, rng: random.Random) -> Problem:
        if self.op == "div":
            # Not commutative: the division as written is its only spelling.
            expression, value = self._division(rng)
            key = expression
        else:
            operands, operators = self._chain(rng)
            expression = written(operands, operators)
            value, key = evaluate(operands, operators), canonical(operands, operators)
        answer = str(value)
        return Problem(
            key=f"arith:{key}",
            question=expression,
            metadata={"answer": answer},
            reference=answer_text(answer, self.style),
        )

    def respell(self, problem: Problem, rng: random.Random) -> Problem:
        """``problem`` with its terms and factors in another order (a division as written)."""
        if self.op == "div":
            return problem
        return replace(problem, question=respelled(*parsed(problem.question), rng))

    def _operand(self, rng: random.Random, low: int = 0) -> int:
        return rng.randint(low, 10**self.digits - 1)

    def _chain(self, rng: random.Random) -> tuple[list[int], list[str]]:
        operands = [self._operand(rng) for _ in range(self.terms)]
        if self.op == "mixed":
            operators = [rng.choice("+-*") for _ in operands[1:]]
        else:
            operators = [_SYMBOL[self.op]] * (self.terms - 1)
        return operands, operators

    def _division(self, rng: random.Random) -> tuple[str, int]:
        # Exact division only: the answer stays an integer.
        divisor, quotient = self._operand(rng, low=1), self._operand(rng)
        return f"{divisor * quotient}/{divisor}", quotient


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, params)
    source = ArithmeticSource(
        op=read.choice("op", "add", OPS),
        digits=read.integer("digits", 1, 1, 9),
        terms=read.integer("terms", 2, 2, 6),
        style=answer_style(read.choice("style", "tag", STYLES)),
    )
    read.done()
    system = f"Compute the value of the expression. {INSTRUCTIONS[source.style]}"
    return Domain(
        name=name,
        kind="arithmetic",
        source=source,
        prompt=PromptFormat(system=system, template="{question}="),
        validators=(ValidatorSpec(kind="math", params={"extract": source.style}),),
        max_tokens=8 + 2 * source.digits * source.terms,
        # An answer is a few tokens: a completion that reaches the limit ran on after it.
        overlong="filter",
        description=f"{source.op} of {source.terms} numbers of up to {source.digits} digits",
    )
