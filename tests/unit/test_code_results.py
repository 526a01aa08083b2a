"""Reading a code run's output in the validator: each line is the candidate's claim, so a
line may say anything, and nothing it says may raise, count twice or reach past the
calls; values compare with their types held."""

from __future__ import annotations

import random

import pytest

from protocol.messages import SandboxResult, SandboxStatus
from services.validator.code import Cases, judge
from services.validator.code_results import MARK, UNREADABLE, returned, same


def test_only_the_first_line_of_each_call_in_range_counts() -> None:
    out = "\n".join(
        [
            f"{MARK} 0 1",
            f"{MARK} 0 2",  # a second line for a call does not replace the first
            f"{MARK} 1 not a literal",
            f"{MARK} 1 [1, 2]",  # nor after an unreadable first one
            f"{MARK} 7 5",  # no call 7
            f"{MARK} -1 5",
            f"x{MARK} 2 5",
            f" {MARK} 2 5",
        ]
    )
    assert returned(out, 3, "python") == {0: 1, 1: UNREADABLE}
    assert returned(f'{MARK} 0 {{"a": [true, null]}}', 1, "js") == {0: {"a": [True, None]}}


@pytest.mark.parametrize(
    "line",
    [
        f"{MARK} ² 1",  # a digit to str.isdigit, not to int
        f"{MARK} {'0' * 5000} 1",  # past int()'s digit limit
        f"{MARK} {'9' * 40} 1",
        f"{MARK} 0 {'[' * 100_000}",  # nested past the parser's depth
        f"{MARK} 0 {'1' * 5000}",  # past int()'s digit limit, in the value
        f"{MARK} 0 __import__('os').system('true')",
        f"{MARK} 0 [{'0,' * 200_000}0]",  # a parse tree too big to build
    ],
)
def test_a_hostile_line_is_nothing_or_unreadable_never_an_error(line: str) -> None:
    for language in ("python", "cpp", "js"):
        assert set(returned(line, 3, language).values()) <= {UNREADABLE}


def test_random_bytes_never_raise() -> None:
    rng = random.Random(7)
    alphabet = f"{MARK} 0123456789[]{{}}()'\",.:-eE\\n\x00²".replace("\\n", "\n")
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        for language in ("python", "js"):
            found = returned(text, 4, language)
            assert set(found) <= set(range(4))


@pytest.mark.parametrize(
    ("got", "want", "equal"),
    [
        (3, 3, True),
        (3.0, 3, True),  # JSON has one number type
        (True, 1, False),
        (1, True, False),
        ([1, 2], (1, 2), False),
        ((1, 2), (1, 2), True),
        ([True], [1], False),
        ({"a": [1]}, {"a": [1]}, True),
        ({"a": [1]}, {"a": [1], "b": 2}, False),
        ("1", 1, False),
        (None, 0, False),
        (float("nan"), float("nan"), False),
        ({1, 2}, {2, 1}, True),
        (UNREADABLE, 1, False),
        (b"x", "x", False),
    ],
)
def test_values_compare_with_types_held(got: object, want: object, equal: bool) -> None:
    assert same(got, want) is equal


def test_nesting_past_any_expected_value_is_not_equal() -> None:
    deep: list[object] = []
    for _ in range(200):
        deep = [deep]
    assert not same(deep, deep)


def test_a_cut_short_last_line_is_not_a_value() -> None:
    cases = Cases(calls=["f(0)", "f(1)"], expected=[12, 3])
    # The output limit cut "12345" down to "12": that is not what call 0 returned.
    stdout = f"{MARK} 1 3\n{MARK} 0 12"
    result = SandboxResult(
        id="r", status=SandboxStatus.OUTPUT_LIMIT, stdout=stdout, stdout_truncated=True
    )
    assert judge(result, cases, "python").score == 0.5
    whole = SandboxResult(id="r", status=SandboxStatus.OK, stdout=stdout)
    assert judge(whole, cases, "python").score == 1.0
