"""The arithmetic that detectron2's own yaml configs write as ``!!python/object/apply:eval``
(``Base-RetinaNet.yaml``'s anchor sizes, ``[[x, x * 2**(1.0/3), x * 2**(2.0/3)] for x in [32,
...]]``; Panoptic-DeepLab's ``[int(x * 0.1 * 640) for x in range(5, 16)]``), evaluated without
Python's ``eval``.

:func:`evaluate_expression` walks the expression's syntax tree itself and knows only numbers,
strings, arithmetic, comparisons, lists, tuples, list comprehensions over them and the calls in
:data:`ALLOWED_CALLS`. There is no attribute access, indexing, other name or other call, so
nothing in the text can reach an object it did not create. The operators are Python's own
(:mod:`operator`), so the values are exactly those ``eval`` gives.

The bounds hold for the whole evaluation, not for each piece: the text's length and nesting,
one integer's digits, one sequence's length, and one budget of steps for everything the
evaluation does and creates (each part evaluated, each loop turn, each list item, character and
digit made, each item a call reads), which the whole value as it would be printed also fits
in. Sizes are checked before the work that would make them, from the operands' sizes, so a
refusal comes at once.
"""

import ast
import math
import operator
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from lambda_det.utils.setting import shown

__all__ = [
    "ExpressionError",
    "evaluate_expression",
    "ALLOWED_CALLS",
    "MAX_TEXT_LENGTH",
    "MAX_DEPTH",
    "MAX_LENGTH",
    "MAX_STEPS",
    "MAX_INTEGER_DIGITS",
    "integer_digits",
]

ALLOWED_CALLS: Mapping[str, Callable] = {
    "range": range,
    "int": int,
    "float": float,
    "round": round,
    "abs": abs,
    "min": min,
    "max": max,
    "len": len,
    "sum": sum,
}
# Far above what any config's list of sizes needs, far below what takes a machine's memory or
# a second: detectron2's longest expression is 80 characters, 8 levels deep, 30 steps.
MAX_TEXT_LENGTH = 10_000  # characters of one expression
MAX_DEPTH = 100  # levels of its syntax tree (each comprehension loop counts as one)
MAX_LENGTH = 100_000  # items of one list, tuple or range; characters of one string
MAX_STEPS = 250_000  # of the whole evaluation, and the printed size of any value it makes
MAX_INTEGER_DIGITS = 1_000  # decimal digits of one integer (Python prints at most 4,300)

_LOG10_2 = math.log10(2)

_BINARY: Dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: Dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_COMPARE: Dict[type, Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_SEQUENCES = (str, list, tuple)


class ExpressionError(ValueError):
    """An expression that holds something other than what :func:`evaluate_expression` allows,
    or that is too large; the message names the part refused and the limit."""


def evaluate_expression(text: str) -> Any:
    """The value of the Python expression ``text``, made of numbers, strings, ``+ - * / // % **``,
    comparisons, ``and``/``or``/``not``, lists, tuples, list comprehensions and calls of
    :data:`ALLOWED_CALLS`.

    Raises:
        ExpressionError: anything else (an attribute, a subscript, another name or call, a
            lambda, string formatting, ...), a syntax error, or a text, nesting, integer,
            sequence or amount of work beyond the bounds above.
    """
    if not isinstance(text, str):
        raise ExpressionError(f"the expression is {shown(text)}, not a string of Python arithmetic")
    if len(text) > MAX_TEXT_LENGTH:
        raise ExpressionError(
            f"the expression {shown(text)} is too large: {len(text)} characters, at most "
            f"{MAX_TEXT_LENGTH}"
        )
    tree = _parse(text)
    _check_depth(tree, text)
    try:
        return _Evaluator(text).value(tree.body, {})
    except (ArithmeticError, TypeError, ValueError) as error:  # 1/0, 2.0**5000, [1] + 2, ...
        if isinstance(error, ExpressionError):
            raise
        raise ExpressionError(f"{shown(text)} cannot be evaluated: {error}") from None


def _count(value: int) -> str:
    """An integer for a message: its digits up to 2**64, else its order (repr fails past 4,300
    digits)."""
    return str(value) if value.bit_length() <= 64 else f"about 10**{integer_digits(value) - 1}"


def integer_digits(value: int) -> int:
    """The decimal digits of ``value`` (at most one more than it has), from its bits: ``str``
    would take quadratic time, and fails past 4,300 digits."""
    return int(value.bit_length() * _LOG10_2) + 1


def _parse(text: str) -> ast.Expression:
    try:
        return ast.parse(text.strip(), mode="eval")
    except SyntaxError as error:
        raise ExpressionError(f"{shown(text)} is not a Python expression ({error.msg})") from None
    except ValueError:  # a null character
        raise ExpressionError(f"{shown(text)} is not a Python expression") from None
    except (RecursionError, MemoryError):  # the parser's own depth limits, in a short text
        raise ExpressionError(_too_deep(text)) from None


def _too_deep(text: str) -> str:
    return (
        f"the expression {shown(text)} is too large: it nests operators, calls and brackets "
        f"more than {MAX_DEPTH} levels deep"
    )


def _check_depth(tree: ast.AST, text: str) -> None:
    """Refuse a tree deeper than :data:`MAX_DEPTH`, walked without recursion (a long ``1+1+...``
    is a tree as deep as it is long): the evaluator recurses once per level."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        depth += 1 + (len(node.generators) if isinstance(node, ast.ListComp) else 0)
        if depth > MAX_DEPTH:
            raise ExpressionError(_too_deep(text))
        stack.extend((child, depth) for child in ast.iter_child_nodes(node))


class _Evaluator:
    def __init__(self, text: str):
        self.text = text
        self.steps = 0
        # id -> (a list, tuple or range made here, its printed size): each is measured once,
        # from its items' sizes (and kept alive here, so that no id is reused).
        self.sizes: Dict[int, Tuple[Any, int]] = {}

    # ---- refusals ----

    def part(self, node: ast.AST) -> str:
        return shown(ast.get_source_segment(self.text.strip(), node) or type(node).__name__)

    def refuse(self, node: ast.AST, what: str, why: str = "") -> ExpressionError:
        why = why or (
            f"only numbers, strings, arithmetic, lists, tuples, list comprehensions and "
            f"{', '.join(ALLOWED_CALLS)} are evaluated"
        )
        return ExpressionError(f"{what} {self.part(node)} in {shown(self.text)} is refused: {why}")

    def too_large(self, node: ast.AST, what: str, limit: str) -> ExpressionError:
        return ExpressionError(
            f"{what} {self.part(node)} in {shown(self.text)} is too large: {limit}"
        )

    def spend(self, node: ast.AST, steps: int, what: str = "the expression") -> None:
        """Count ``steps`` of work, or of items made, against :data:`MAX_STEPS`."""
        self.steps += steps
        if self.steps > MAX_STEPS:
            raise self.too_large(
                node,
                what,
                f"an expression takes at most {MAX_STEPS} steps in all (each part evaluated, "
                f"loop turn, item made and item a call reads is one)",
            )

    def check_length(self, node: ast.AST, what: str, length: int) -> None:
        if length > MAX_LENGTH:
            raise self.too_large(
                node,
                what,
                f"{_count(length)} items, at most {MAX_LENGTH} in one list, string or range",
            )

    def check_digits(self, node: ast.AST, what: str, digits: int) -> None:
        if digits > MAX_INTEGER_DIGITS:
            raise self.too_large(
                node, what, f"{_count(digits)} digits, at most {MAX_INTEGER_DIGITS} in a number"
            )

    def check_printed_size(self, node: ast.AST, what: str, size: int) -> None:
        if size > MAX_STEPS:
            raise self.too_large(
                node,
                what,
                f"printed, it holds {_count(size)} items (numbers, digits, characters; a "
                f"repeated item counts each time), at most {MAX_STEPS}",
            )

    # ---- sizes ----

    def size(self, value: Any) -> int:
        """The printed size of ``value``: an integer's digits, a string's characters, one for
        any other number, and a list's items' sizes (a shared item each time it appears)."""
        if isinstance(value, bool) or isinstance(value, float):
            return 1
        if isinstance(value, int):
            return integer_digits(value)
        if isinstance(value, str):
            return max(1, len(value))
        known = self.sizes.get(id(value))
        if known is not None:
            return known[1]
        if isinstance(value, range):
            measured = max(1, _range_length(value))
        else:  # a list or tuple: its items are values of this evaluation, measured already
            measured = 1 + sum(map(self.size, value))
        self.sizes[id(value)] = (value, measured)
        return measured

    def made(self, node: ast.AST, value: Any, what: str, new_items: int) -> Any:
        """``value``, which ``node`` just made of ``new_items`` new items (references or
        characters): those spent, and the whole value within :data:`MAX_STEPS` printed."""
        self.spend(node, new_items, what)
        self.check_printed_size(node, what, self.size(value))
        return value

    # ---- evaluation ----

    def value(self, node: ast.AST, names: Dict[str, Any]) -> Any:
        self.steps += 1  # spend(node, 1), inlined: the one call every part makes
        if self.steps > MAX_STEPS:
            self.spend(node, 0)
        result = self.evaluate(node, names)
        if isinstance(result, int) and not isinstance(result, bool):
            self.check_digits(node, "the integer", integer_digits(result))
        return result

    def evaluate(self, node: ast.AST, names: Dict[str, Any]) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self.binary(node, names)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self.value(node.operand, names))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not self.value(node.operand, names)
        if isinstance(node, ast.BoolOp):
            return self.bool_op(node, names)
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            return self.compare(node, names)
        if isinstance(node, ast.IfExp):
            branch = node.body if self.value(node.test, names) else node.orelse
            return self.value(branch, names)
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self.value(item, names) for item in node.elts]
            made = items if isinstance(node, ast.List) else tuple(items)
            return self.made(node, made, "the list", len(items))
        if isinstance(node, ast.ListComp):
            return self.list_comprehension(node, names)
        if isinstance(node, ast.Call):
            return self.call(node, names)
        kind = "the name" if isinstance(node, ast.Name) else "the part"
        raise self.refuse(node, kind)

    def binary(self, node: ast.BinOp, names: Dict[str, Any]) -> Any:
        left, right = self.value(node.left, names), self.value(node.right, names)
        if isinstance(node.op, ast.Mod) and isinstance(left, str):  # '%*d' % (10**9, 1)
            raise self.refuse(node, "the string formatting", "format strings are not evaluated")
        self.check_integer_result(node, left, right)
        new_items = self.check_sequence_result(node, left, right)
        result = _BINARY[type(node.op)](left, right)
        if new_items is None:
            return result
        return self.made(node, result, "the result", new_items)

    def check_integer_result(self, node: ast.BinOp, left: Any, right: Any) -> None:
        """The digits of an integer power or product, from its operands, before it is made."""
        if not (isinstance(left, int) and isinstance(right, int)):
            return
        if isinstance(node.op, ast.Pow) and right > 0 and abs(left) > 1:
            digits = int(right * math.log10(abs(left))) + 1  # 2**10**10: 3 * 10**9 digits
            self.check_digits(node, "the power", digits)
        if isinstance(node.op, ast.Mult):
            self.check_digits(node, "the product", integer_digits(left) + integer_digits(right))

    def check_sequence_result(self, node: ast.BinOp, left: Any, right: Any) -> Optional[int]:
        """A repetition's or a concatenation's length and printed size, from its operands,
        before it is made; the new items it makes (None: it makes no sequence)."""
        if isinstance(node.op, ast.Mult) and (
            isinstance(left, _SEQUENCES) != isinstance(right, _SEQUENCES)
        ):
            sequence, count = (left, right) if isinstance(left, _SEQUENCES) else (right, left)
            if not isinstance(count, int):
                return None  # Python's TypeError
            count = max(0, count)
            self.check_length(node, "the repetition", len(sequence) * count)
            items = len(sequence) if isinstance(sequence, str) else self.size(sequence) - 1
            self.check_printed_size(node, "the repetition", 1 + items * count)
            return len(sequence) * count
        if isinstance(node.op, ast.Add) and isinstance(left, _SEQUENCES):
            if type(left) is not type(right):
                return None  # Python's TypeError
            self.check_length(node, "the concatenation", len(left) + len(right))
            return len(left) + len(right)
        return None

    def bool_op(self, node: ast.BoolOp, names: Dict[str, Any]) -> Any:
        result = None
        for operand in node.values:  # short-circuits as Python does
            result = self.value(operand, names)
            if isinstance(node.op, ast.And) != bool(result):
                return result
        return result

    def compare(self, node: ast.Compare, names: Dict[str, Any]) -> bool:
        left = self.value(node.left, names)
        for op, comparator in zip(node.ops, node.comparators):
            right = self.value(comparator, names)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def call(self, node: ast.Call, names: Dict[str, Any]) -> Any:
        if not (
            isinstance(node.func, ast.Name)
            and node.func.id in ALLOWED_CALLS
            and node.func.id not in names
            and not node.keywords
        ):
            raise self.refuse(node, "the call")
        name = node.func.id
        arguments = [self.value(argument, names) for argument in node.args]
        self.check_arguments(node, name, arguments)
        result = ALLOWED_CALLS[name](*arguments)
        if isinstance(result, range):
            self.check_length(node, "the range", _range_length(result))
            return self.made(node, result, "the range", 1)
        return result

    def check_arguments(self, node: ast.Call, name: str, arguments: list) -> None:
        """What a call would read or make, before it runs: the text of a number, round's
        digits, the items of sum, min and max."""
        if name in ("int", "float") and arguments and isinstance(arguments[0], str):
            # int('f' * 100000, 16) would make a 400,000-bit integer before any check of it.
            self.check_digits(node, "the number", len(arguments[0].strip()))
        if name == "round" and len(arguments) == 2 and isinstance(arguments[1], int):
            self.check_digits(node, "round's digits", abs(arguments[1]))  # 10**(10**9)
        if name == "sum" and not _numbers(arguments):
            # sum(lists, []) makes a new list at every item: quadratic in the items.
            raise self.refuse(node, "the call", "sum adds numbers only")
        if name in ("sum", "min", "max"):
            for argument in arguments:
                if isinstance(argument, (str, list, tuple, range)):
                    self.spend(node, self.size(argument), "the call")

    def list_comprehension(self, node: ast.ListComp, names: Dict[str, Any]) -> list:
        results: list = []
        printed = 1  # the results' printed size, a shared item counted each time

        def loop(generators, bound):
            nonlocal printed
            if not generators:
                item = self.value(node.elt, bound)
                printed += self.size(item)
                self.check_printed_size(node, "the list", printed)
                self.spend(node, 1, "the list")
                results.append(item)
                self.check_length(node, "the list", len(results))
                return
            first, rest = generators[0], generators[1:]
            if first.is_async or not isinstance(first.target, ast.Name):
                raise self.refuse(first.target, "the loop target")
            iterable = self.value(first.iter, bound)
            if not isinstance(iterable, (list, tuple, range, str)):
                raise self.refuse(first.iter, "the loop over")
            for item in iterable:
                self.spend(node, 1, "the list")  # every turn of every loop, kept or not
                inner = {**bound, first.target.id: item}
                if all(self.value(condition, inner) for condition in first.ifs):
                    loop(rest, inner)

        loop(node.generators, names)
        self.sizes[id(results)] = (results, printed)
        return results


def _numbers(arguments: list) -> bool:
    """Whether sum's arguments are an iterable of numbers and a number to start from."""
    if not arguments or not isinstance(arguments[0], (list, tuple, range)):
        return False
    values = [*arguments[1:]] + ([] if isinstance(arguments[0], range) else [*arguments[0]])
    return all(isinstance(value, (int, float)) for value in values)


def _range_length(values: range) -> int:
    """``len(values)``, also past what ``len`` can return (range(10**30))."""
    try:
        return len(values)
    except OverflowError:
        return MAX_LENGTH + 1 + abs(values.stop - values.start) // abs(values.step)
