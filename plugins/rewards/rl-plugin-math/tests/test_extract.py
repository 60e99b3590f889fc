"""The final-answer extractor on the surface forms GSM8K answers come in."""

from fractions import Fraction

import pytest

from rl_plugin_math.extract import extract_number, find_numbers, last_boxed, same_number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so she makes 18 dollars\n#### 18", 18),
        ("#### 1,000", 1000),  # thousands separators
        ("#### $1,250.50", Fraction("1250.5")),  # dollar sign and cents
        ("#### 18 dollars", 18),  # units after the number
        ("#### 18.0", 18),  # trailing .0
        ("#### 18.", 18),  # sentence-ending period
        ("#### 18 (because 9 * 2 = 18)", 18),  # first number after the marker
        ("#### -5", -5),
        ("#### 50%", 50),
        ("it is 3 then 4 #### 7\nand more text 9", 7),  # the marker wins over the last number
        ("a 1 then \\boxed{42} then 7", 42),  # boxed wins over the last number
        ("\\boxed{\\frac{3}{4}}", Fraction(3, 4)),
        ("\\boxed{\\$1{,}000}", 1000),  # LaTeX thousands separator and escaped dollar
        ("\\boxed{18 \\text{ eggs}}", 18),
        ("<think>2+2 is 5?</think><answer>4</answer>", 4),
        ("Janet sells 16-3-4 = 9 eggs, and earns 18 dollars.", 18),  # the last number
        ("16-3-4", 4),  # a minus glued to a digit is an operator, not a sign
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_number(text: str, expected: object) -> None:
    got = extract_number(text)
    assert got == (None if expected is None else Fraction(expected))


def test_numbers_and_types() -> None:
    assert find_numbers("a 1,234 b 5.5 c -2") == ["1,234", "5.5", "-2"]
    assert extract_number(72) == 72 and extract_number(2.5) == Fraction(5, 2)
    assert last_boxed("\\boxed{a{b}c} \\boxed{x{y}}") == "x{y}"
    assert same_number(Fraction(1, 3), Fraction("0.333333"))
    assert not same_number(Fraction(18), Fraction(19))
    assert not same_number(Fraction(1450001), Fraction(1450000))  # integers compare exactly
    assert not same_number(None, Fraction(1))
    with pytest.raises(TypeError):
        extract_number(["18"])  # type: ignore[arg-type]
