"""Numbers as models write them, parsed exactly (``Fraction``) and compared with a tolerance.

Accepted: integers, decimals, thousands separators (``1,234,567.5``, LaTeX
``1{,}234``), exponents (``1.5e3``), fractions (``3/4``, ``\\frac{3}{4}``),
percentages (``45%``, ``45\\%``, ``45 percent``), currency signs, the Unicode minus,
and surrounding ``$...$`` or ``\\(...\\)``.  Anything else is ``None``: parsing never raises.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

#: Longer text is not a number a model wrote as its answer; it is not parsed at all.
MAX_TEXT: Final = 256
#: Exponents beyond this are refused: 1e999999999 would take memory to build exactly.
MAX_EXPONENT: Final = 400

_NUMBER: Final = re.compile(
    r"""
    (?P<sign>[-+\u2212]?)\s*
    (?:\\?\$|€|£)?\s*
    (?P<body>\d{1,3}(?:(?:,|\{,\})\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?|\.\d+)
    (?:[eE](?P<exp>[-+]?\d{1,4}))?
    (?P<percent>\s*(?:\\?%|percent\b))?
    """,
    re.VERBOSE,
)
_FRAC: Final = re.compile(r"(?P<sign>[-+\u2212]?)\\[dt]?frac\{(?P<num>[^{}]*)\}\{(?P<den>[^{}]*)\}")
_LATEX_NOISE: Final = re.compile(r"\\[,!;: ]|\\left|\\right|\\text\{\s*\}")
#: A unit after the number (``12 apples``, ``3.5 km/h``, ``7 \\text{ cm}``) is not part of it.
_UNIT: Final = re.compile(
    r"(?<=[\d}])\s*(?!percent\b)(?:\\(?:text|mathrm)\{[^{}]*\}|[A-Za-z][A-Za-z/ ]*)$"
)
_DELIMITERS: Final = (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


@dataclass(frozen=True, slots=True)
class Number:
    """A parsed number: ``45%`` is ``Number(45, percent=True)``."""

    value: Fraction
    percent: bool = False

    @property
    def scaled(self) -> Fraction:
        """The value as a plain quantity (``45%`` -> ``0.45``)."""
        return self.value / 100 if self.percent else self.value


def _clean(text: str) -> str:
    text = _LATEX_NOISE.sub("", text.strip())
    for start, end in _DELIMITERS:
        if len(text) > len(start) + len(end) and text.startswith(start) and text.endswith(end):
            text = text[len(start) : -len(end)].strip()
    return _UNIT.sub("", text.removeprefix("=").rstrip(".").strip())


def _from_match(match: re.Match[str]) -> Number | None:
    exponent = int(match.group("exp") or 0)
    if abs(exponent) > MAX_EXPONENT:
        return None
    body = match.group("body").replace("{,}", "").replace(",", "")
    # From integers, not Fraction(str): several times faster, and this runs per rollout.
    whole, _, decimals = body.partition(".")
    scale = 10 ** len(decimals)
    value = Fraction(int(whole or "0") * scale + int(decimals or "0"), scale)
    if exponent:
        value *= Fraction(10) ** exponent
    if match.group("sign") in ("-", "\u2212"):
        value = -value
    return Number(value, percent=bool(match.group("percent")))


def _plain(text: str) -> Number | None:
    match = _NUMBER.fullmatch(text)
    return _from_match(match) if match else None


def _ratio(numerator: str, denominator: str) -> Number | None:
    top, bottom = _plain(_clean(numerator)), _plain(_clean(denominator))
    if top is None or bottom is None or top.percent or bottom.percent or bottom.value == 0:
        return None
    return Number(top.value / bottom.value)


# Pure, and called twice a rollout (reference and answer) with texts that repeat across a
# GRPO group and across tasks: the cache skips the regexes and Fraction arithmetic.
# Inputs are at most MAX_TEXT characters and Number is frozen, so sharing is safe.
@functools.lru_cache(maxsize=8192)
def parse_number(text: str) -> Number | None:
    """The number ``text`` holds as a whole, or ``None``."""
    if len(text) > MAX_TEXT:
        return None
    text = _clean(text)
    frac = _FRAC.fullmatch(text)
    if frac:
        ratio = _ratio(frac.group("num"), frac.group("den"))
        negative = frac.group("sign") in ("-", "\u2212")
        return Number(-ratio.value) if ratio is not None and negative else ratio
    if text.count("/") == 1:
        return _ratio(*text.split("/"))
    return _plain(text)


def find_numbers(text: str) -> list[Number]:
    """Every number written in ``text``, in order (fractions are read as two numbers)."""
    found = (_from_match(m) for m in _NUMBER.finditer(text))
    return [number for number in found if number is not None]


@functools.lru_cache(maxsize=256)
def _tolerance(tolerance: float) -> tuple[int, int]:
    """A float tolerance as an exact integer ratio (a slow conversion; a few values recur)."""
    return Fraction(tolerance).as_integer_ratio()


def close(a: Fraction, b: Fraction, rel_tol: float, abs_tol: float) -> bool:
    """|a - b| <= max(abs_tol, rel_tol x max(|a|, |b|)), exactly.

    Worked in integers (both sides multiplied by the denominators): the same answer as
    Fraction arithmetic without building a Fraction per step.
    """
    an, ad, bn, bd = a.numerator, a.denominator, b.numerator, b.denominator
    if an == bn and ad == bd:  # the common case for a right answer (Fractions are reduced)
        return True
    diff = abs(an * bd - bn * ad)  # |a - b| x ad x bd
    abs_num, abs_den = _tolerance(abs_tol)
    if diff * abs_den <= abs_num * ad * bd:
        return True
    rel_num, rel_den = _tolerance(rel_tol)
    return diff * rel_den <= rel_num * max(abs(an) * bd, abs(bn) * ad)


def numbers_match(got: Number, want: Number, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Equal within tolerance, as written (``45%`` ~ ``45``) or as quantities (``0.45``)."""
    if close(got.value, want.value, rel_tol, abs_tol):
        return True
    # As quantities a percentage is 100 times smaller: so is the absolute tolerance.
    scaled_tol = abs_tol / 100
    return (got.percent or want.percent) and close(got.scaled, want.scaled, rel_tol, scaled_tol)
