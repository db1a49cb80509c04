"""The bounds of the expression evaluator (detectron2's ``!!python/object/apply:eval`` tag) hold
for the whole evaluation: what it makes in all, the whole value as printed, an integer's digits,
round's digits, the text of a number, the expression's length and depth. Each payload is one
ExpressionError line naming its limit, within a second; each control shows, at a size the test
can afford, that the payload is what Python's own eval (or the evaluator with the bound off)
would build."""

import ast
import time

import pytest

from lambda_det.config import expressions
from lambda_det.config.expressions import ExpressionError, evaluate_expression

LONG_SUM = "+".join(["1"] * 1000)  # a tree 1000 levels deep
DEEP_MINUS = "-" * 5000 + "1"  # 5001 characters: within the text bound, past the parser's depth

# payload: what the one line says (the payloads, at their full sizes)
PAYLOADS = {
    "[[0]*100000 for x in range(100000)]": f"at most {expressions.MAX_STEPS} steps in all",
    "['a'*100000 for x in range(100000)]": f"at most {expressions.MAX_STEPS} steps in all",
    "[[x] * 100000 for x in ['a' * 100000]]": "printed, it holds",
    "[[0]*100000]*100000": "printed, it holds 10000100001 items",
    "sum([[0]*100000]*100000, [])": "printed, it holds 10000100001 items",
    "sum([[1], [2]], [])": "sum adds numbers only",
    "sum(range(10**10))": "10000000000 items, at most 100000",
    "round(5, -10**9)": "round's digits 'round(5, -10**9)' in 'round(5, -10**9)' is too large",
    "int('f'*100000, 16)": "100000 digits, at most 1000 in a number",
    "int('f'*1000, 16)": "the integer \"int('f'*1000, 16)\"",
    "float('1' * 5000)": "5000 digits, at most 1000 in a number",
    "2 ** 10 ** 10": "the power '2 ** 10 ** 10'",
    "10 ** 999 * 10 ** 999": "the product",
    "'%*d' % (10**9, 1)": "format strings are not evaluated",
    "range(10**30)": "about 10**30 items",
    "0x" + "f" * 9000: "10838 digits, at most 1000",
    LONG_SUM: f"more than {expressions.MAX_DEPTH} levels deep",
    DEEP_MINUS: f"more than {expressions.MAX_DEPTH} levels deep",
    "not " * 100000 + "1": f"400001 characters, at most {expressions.MAX_TEXT_LENGTH}",
    "-" * 100000 + "1": f"100001 characters, at most {expressions.MAX_TEXT_LENGTH}",
    "[" * 100 + "]" * 100: "more than 100 levels deep",
}


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda payload: payload[:40])
def test_a_payload_is_one_line_naming_the_limit_within_a_second(payload):
    start = time.perf_counter()
    with pytest.raises(ExpressionError) as error:
        evaluate_expression(payload)
    assert time.perf_counter() - start < 1.0
    message = str(error.value)
    assert PAYLOADS[payload] in message, message
    assert "\n" not in message and len(message) < 600, message
    assert "is too large" in message or "is refused" in message, message


def test_python_builds_what_the_bounds_refuse():
    """The negative control, at a thousandth of each payload or less: Python's eval builds
    them, and nothing stops it growing with the payload's numbers."""
    assert sum(map(len, eval("[[0]*100 for x in range(100)]"))) == 10**4  # 10**10 at 100000
    assert len(repr(eval("[[0]*100]*100"))) == 30_200  # 3 * 10**10 characters at 100000
    assert eval("sum([[1], [2]], [])") == [1, 2]  # a new list at every item: quadratic
    assert eval("int('f'*1000, 16)").bit_length() == 4000  # 400,000 bits at 100000
    assert len(eval("'%*d' % (10**5, 1)")) == 10**5  # a string as long as the number says
    assert eval("round(5, -10**3)") == 0  # computing 10**(10**3): 10**(10**9) takes hours
    with pytest.raises((RecursionError, MemoryError)):  # the parser's own limits (Python
        ast.parse("-" * 100_000 + "1", mode="eval")  # 3.13's parser builds DEEP_MINUS)


@pytest.mark.parametrize(
    "bound,payload",
    [
        ("MAX_STEPS", "[[0]*1000 for x in range(300)]"),  # 300,000 items made in all
        ("MAX_STEPS", "[[0]*1000]*300"),  # 300,000 as printed
        ("MAX_INTEGER_DIGITS", "int('f'*1200, 16)"),
        ("MAX_INTEGER_DIGITS", "round(5, -1200)"),
        ("MAX_LENGTH", "[0] * 200000"),
    ],
)
def test_each_bound_is_what_refuses_its_payload(monkeypatch, bound, payload):
    """The negative control of each bound: refused with it; with it lifted, the evaluator
    gives Python's value."""
    with pytest.raises(ExpressionError, match="is too large"):
        evaluate_expression(payload)
    monkeypatch.setattr(expressions, bound, 10**12)
    assert evaluate_expression(payload) == eval(payload)


def test_without_the_depth_bound_a_long_sum_overflows_the_stack(monkeypatch):
    monkeypatch.setattr(expressions, "MAX_DEPTH", 10**6)
    with pytest.raises(RecursionError):
        evaluate_expression("+".join(["1"] * 2000))  # parsed, then evaluated 2000 deep


def test_the_bounds_leave_room_for_every_config_value():
    """What detectron2's configs write, and far larger lists, pass."""
    assert evaluate_expression("[x for x in range(50000)]") == list(range(50000))
    assert evaluate_expression("[[0] * 1000] * 200") == [[0] * 1000] * 200
    assert evaluate_expression("2 ** 3000") == 2**3000
    assert evaluate_expression("round(1234.5678, -2)") == 1200.0
    assert evaluate_expression("int('ff', 16) + int(' 12 ') + sum(range(1000))") == 499_767
    assert evaluate_expression("+".join(["1"] * 90)) == 90
    assert evaluate_expression("(" * 90 + "1" + ")" * 90) == 1
