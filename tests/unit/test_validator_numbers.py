"""Number parsing and matching: examples, and properties over generated numbers."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.validator.numbers import Number, find_numbers, numbers_match, parse_number


@pytest.mark.parametrize(
    ("text", "value", "percent"),
    [
        ("7", Fraction(7), False),
        ("  -7 ", Fraction(-7), False),
        ("\u22122", Fraction(-2), False),
        ("+3", Fraction(3), False),
        ("1,234,567.5", Fraction(2469135, 2), False),
        ("1{,}000", Fraction(1000), False),
        ("$1,234", Fraction(1234), False),
        ("\\$5.50", Fraction(11, 2), False),
        (".5", Fraction(1, 2), False),
        ("5.", Fraction(5), False),
        ("1.5e3", Fraction(1500), False),
        ("2E-2", Fraction(1, 50), False),
        ("3/4", Fraction(3, 4), False),
        ("-3/4", Fraction(-3, 4), False),
        ("\\frac{3}{4}", Fraction(3, 4), False),
        ("\\dfrac{-6}{8}", Fraction(-3, 4), False),
        ("-\\frac{1}{2}", Fraction(-1, 2), False),
        ("$\\frac{1}{2}$", Fraction(1, 2), False),
        ("\\(42\\)", Fraction(42), False),
        ("= 12.", Fraction(12), False),
        ("45%", Fraction(45), True),
        ("45\\%", Fraction(45), True),
        ("12.5 percent", Fraction(25, 2), True),
        ("12 apples", Fraction(12), False),
        ("3.5 km/h", Fraction(7, 2), False),
        ("7 \\text{ cm}", Fraction(7), False),
    ],
)
def test_parses_what_models_write(text: str, value: Fraction, percent: bool) -> None:
    assert parse_number(text) == Number(value, percent)


@pytest.mark.parametrize(
    "text",
    ["", "abc", "seven", "1/0", "\\frac{1}{0}", "1,23", "1.2.3", "--5", "1e99999", "x" * 300],
)
def test_refuses_what_is_not_one_number(text: str) -> None:
    assert parse_number(text) is None


def test_find_numbers_reads_every_number_in_order() -> None:
    found = find_numbers("Q3 2023 revenue was $1,234.5 thousand, up 12.5%.")
    assert [n.value for n in found] == [3, 2023, Fraction(12345, 10), Fraction(25, 2)]
    assert [n.percent for n in found] == [False, False, False, True]


def test_matching_with_tolerance_and_percentages() -> None:
    def match(got: str, want: str, rel: float = 1e-6) -> bool:
        a, b = parse_number(got), parse_number(want)
        assert a is not None and b is not None
        return numbers_match(a, b, rel_tol=rel)

    assert match("0.5", "1/2") and match("\\frac{1}{2}", "0.5")
    assert match("45%", "45") and match("45%", "0.45") and match("0.45", "45%")
    assert not match("0.45", "45") and not match("46%", "45%")
    assert match("100.4", "100", rel=0.005) and not match("100.6", "100", rel=0.005)
    assert not match("1000002", "1000000") and match("1000000.5", "1000000")


integers = st.integers(min_value=-(10**30), max_value=10**30)


@given(integers)
def test_integers_round_trip_plain_and_with_separators(n: int) -> None:
    assert parse_number(str(n)) == Number(Fraction(n))
    assert parse_number(f"{n:,}") == Number(Fraction(n))


@given(
    st.decimals(
        allow_nan=False, allow_infinity=False, places=6, max_value=10**12, min_value=-(10**12)
    )
)
def test_decimals_are_parsed_exactly(d: Decimal) -> None:
    text = format(d, "f")
    assert parse_number(text) == Number(Fraction(text))
    assert parse_number(f"{d:,f}") == Number(Fraction(text))


@given(integers, st.integers(min_value=1, max_value=10**9))
def test_fractions_slash_and_latex(p: int, q: int) -> None:
    want = Number(Fraction(p, q))
    assert parse_number(f"{p}/{q}") == want
    assert parse_number(f"\\frac{{{p}}}{{{q}}}") == want


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["%", "\\%", " percent"]))
def test_percentages_match_as_written_and_as_quantities(n: int, sign: str) -> None:
    got = parse_number(f"{n}{sign}")
    assert got == Number(Fraction(n), percent=True)
    assert numbers_match(got, Number(Fraction(n)))
    assert numbers_match(got, Number(Fraction(n, 100)))


@given(
    st.floats(min_value=-1e9, max_value=1e9, allow_nan=False).filter(lambda x: abs(x) > 1e-3),
    st.floats(min_value=0.0, max_value=0.9),
)
def test_tolerance_is_relative(x: float, fraction_of_tol: float) -> None:
    rel = 1e-4
    want = Number(Fraction(x))
    assert numbers_match(Number(Fraction(x * (1 + rel * fraction_of_tol))), want, rel_tol=rel)
    assert not numbers_match(Number(Fraction(x * (1 + rel * 3))), want, rel_tol=rel, abs_tol=0)


@given(st.text(max_size=300))
def test_any_text_parses_or_is_refused_without_raising(text: str) -> None:
    result = parse_number(text)
    assert result is None or isinstance(result.value, Fraction)
    assert all(isinstance(n.value, Fraction) for n in find_numbers(text))
