"""Math word problems from templates, at five difficulty levels.

Answers are exact (integers, terminating decimals, fractions, percentages) so the
math validator can check them with a tight tolerance.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any, Final

from services.domains.api import Domain, Problem, PromptFormat, ValidatorSpec
from services.domains.formats import INSTRUCTIONS, STYLES, AnswerStyle, answer_style, answer_text
from services.domains.params import Params

#: (key values, question, answer) for a difficulty level.  The key values are what
#: decides the problem, in an order that does not depend on its wording: values that play
#: the same part in the maths (the two factors of a product, two pipes) come sorted.
Made = tuple[tuple[int, ...], str, str]
Template = Callable[[random.Random, int], Made]
_SCALE: Final = (10, 30, 100, 1000, 10_000)


def decimal_text(value: Fraction) -> str:
    """Exact decimal text of a fraction whose denominator has only the factors 2 and 5."""
    with localcontext() as context:
        context.prec = 60
        exact = Decimal(value.numerator) / Decimal(value.denominator)
    text = format(exact.normalize(), "f")
    return text if text != "-0" else "0"


def fraction_text(value: Fraction) -> str:
    return (
        str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    )


def _apples(rng: random.Random, level: int) -> Made:
    m = _SCALE[level - 1]
    a, b, c = rng.randint(1, m), rng.randint(2, 2 + 2 * level), rng.randint(2, m // 2 + 2)
    d = rng.randint(0, a)
    question = (
        f"Ann has {a} apples. She buys {b} bags with {c} apples in each bag, then gives "
        f"{d} apples to a friend. How many apples does she have now?"
    )
    # b bags of c apples or c bags of b: the same a + b*c - d.
    return (a, *sorted((b, c)), d), question, str(a + b * c - d)


def _speed(rng: random.Random, level: int) -> Made:
    hours, m = rng.randint(2, 4 + level), _SCALE[level - 1]
    # Speeds in tenths of km/h: whole numbers at the easy levels, one decimal after.
    tenths = 10 * rng.randint(1, m) if level < 3 else rng.randint(10, 10 * m)
    distance = decimal_text(Fraction(tenths * hours, 10))
    question = (
        f"A train travels {distance} km in {hours} hours at a constant speed. "
        "What is its speed in km/h?"
    )
    return (tenths, hours), question, decimal_text(Fraction(tenths, 10))


def _discount(rng: random.Random, level: int) -> Made:
    price, rate = rng.randint(1, _SCALE[level - 1]), rng.choice((5, 10, 15, 20, 25, 30, 40, 50))
    question = (
        f"A jacket costs ${price}. It is sold at a {rate}% discount. "
        "What is the sale price in dollars?"
    )
    return (price, rate), question, decimal_text(Fraction(price * (100 - rate), 100))


def _sharing(rng: random.Random, level: int) -> Made:
    friends, pizzas = rng.randint(2, 3 + 2 * level), rng.randint(1, 3 * level + 2)
    question = (
        f"{friends} friends share {pizzas} pizzas equally. How much pizza does each friend "
        "get? Answer with a fraction in lowest terms."
    )
    return (friends, pizzas), question, fraction_text(Fraction(pizzas, friends))


def _percent(rng: random.Random, level: int) -> Made:
    # Class sizes that divide a power of ten, so the percentage is a terminating decimal.
    students = rng.choice(
        (4, 5, 8, 10, 20, 25, 40, 50, 80, 100, 125, 200, 250, 400)[: 4 + 2 * level]
    )
    passed = rng.randint(0, students)
    question = (
        f"A class has {students} students and {passed} of them passed. What percentage passed?"
    )
    return (students, passed), question, decimal_text(Fraction(100 * passed, students)) + "%"


def _pipes(rng: random.Random, level: int) -> Made:
    first, second = rng.randint(1, 3 + 3 * level), rng.randint(1, 3 + 3 * level)
    question = (
        f"One pipe fills a tank in {first} hours and another in {second} hours. "
        "Working together, how many hours do they take? Answer with a fraction in lowest terms."
    )
    return (
        tuple(sorted((first, second))),
        question,
        fraction_text(Fraction(first * second, first + second)),
    )


def _interest(rng: random.Random, level: int) -> Made:
    principal, rate = 100 * rng.randint(1, _SCALE[level - 1]), rng.randint(1, 12)
    years = rng.randint(1, 2 + level)
    question = (
        f"${principal} is invested at {rate}% simple interest per year for {years} years. "
        "How many dollars of interest does it earn?"
    )
    # Rate and years enter only as their product.
    return (principal, *sorted((rate, years))), question, str(principal * rate * years // 100)


def _ages(rng: random.Random, level: int) -> Made:
    sam, gap, later = rng.randint(1, 10 * level + 5), rng.randint(1, 20 + level), rng.randint(1, 10)
    total = 2 * sam + gap + 2 * later
    question = (
        f"Tom is {gap} years older than Sam. In {later} years their ages will add up to "
        f"{total}. How old is Sam now?"
    )
    return (sam, gap, later), question, str(sam)


TEMPLATES: Final[dict[str, Template]] = {
    "apples": _apples,
    "speed": _speed,
    "discount": _discount,
    "sharing": _sharing,
    "percent": _percent,
    "pipes": _pipes,
    "interest": _interest,
    "ages": _ages,
}


@dataclass(frozen=True)
class WordProblemSource:
    templates: tuple[str, ...]
    level: int
    style: AnswerStyle

    def draw(self, rng: random.Random) -> Problem:
        name = rng.choice(self.templates)
        values, question, answer = TEMPLATES[name](rng, self.level)
        # No level in the key: the same numbers make the same problem at every level.
        return Problem(
            key=f"wp:{name}:{','.join(map(str, values))}",
            question=question,
            metadata={"answer": answer},
            reference=f"Step by step, the answer is {answer}. {answer_text(answer, self.style)}",
        )


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, params)
    template = read.choice("template", "any", ("any", *TEMPLATES))
    source = WordProblemSource(
        templates=tuple(TEMPLATES) if template == "any" else (template,),
        level=read.integer("difficulty", 1, 1, len(_SCALE)),
        style=answer_style(read.choice("style", "boxed", STYLES)),
    )
    max_chars = read.integer("max_chars", 1500, 10, 1_000_000)
    read.done()
    return Domain(
        name=name,
        kind="word_problems",
        source=source,
        prompt=PromptFormat(
            system=f"Solve the problem. Think briefly. {INSTRUCTIONS[source.style]}"
        ),
        validators=(
            ValidatorSpec(kind="math", params={"extract": source.style}),
            # Rambling costs up to the whole reward (the length score runs from 0 to -1).
            ValidatorSpec(kind="length", params={"limit": max_chars, "hard": 2 * max_chars}),
        ),
        max_tokens=512,
        description=f"word problems ({template}) at difficulty {source.level}",
    )
