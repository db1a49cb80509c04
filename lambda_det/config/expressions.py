"""The arithmetic that detectron2's own yaml configs write as ``!!python/object/apply:eval``
(``Base-RetinaNet.yaml``'s anchor sizes, ``[[x, x * 2**(1.0/3), x * 2**(2.0/3)] for x in [32,
...]]``; Panoptic-DeepLab's ``[int(x * 0.1 * 640) for x in range(5, 16)]``), evaluated without
Python's ``eval``.

:func:`evaluate_expression` walks the expression's syntax tree itself and knows only numbers,
strings, arithmetic, comparisons, lists, tuples, list comprehensions over them and the calls in
:data:`ALLOWED_CALLS`. There is no attribute access, indexing, other name or other call, so
nothing in the text can reach an object it did not create. The operators are Python's own
(:mod:`operator`), so the values are exactly those ``eval`` gives.
"""

import ast
import operator
from typing import Any, Callable, Dict, Mapping

__all__ = ["ExpressionError", "evaluate_expression", "ALLOWED_CALLS"]

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
# Bounds that keep one config line from taking the machine: a sequence longer than any config's
# list of sizes, and integers of more bits than any config value needs.
MAX_LENGTH = 100_000
MAX_INTEGER_BITS = 4_096

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


class ExpressionError(ValueError):
    """An expression that holds something other than what :func:`evaluate_expression` allows,
    or that is too large; the message names the part refused."""


def evaluate_expression(text: str) -> Any:
    """The value of the Python expression ``text``, made of numbers, strings, ``+ - * / // % **``,
    comparisons, ``and``/``or``/``not``, lists, tuples, list comprehensions and calls of
    :data:`ALLOWED_CALLS`.

    Raises:
        ExpressionError: anything else (an attribute, a subscript, another name or call, a
            lambda, ...), a syntax error, or a list or power beyond the bounds above.
    """
    if not isinstance(text, str):
        raise ExpressionError(f"the expression is {text!r}, not a string of Python arithmetic")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as error:
        raise ExpressionError(f"{text!r} is not a Python expression ({error.msg})") from None
    try:
        return _Evaluator(text).value(tree.body, {})
    except (ArithmeticError, TypeError, ValueError) as error:  # 1/0, 2.0**5000, [1] + 2, ...
        if isinstance(error, ExpressionError):
            raise
        raise ExpressionError(f"{text!r} cannot be evaluated: {error}") from None


class _Evaluator:
    def __init__(self, text: str):
        self.text = text

    def refuse(self, node: ast.AST, what: str, too_large: bool = False) -> ExpressionError:
        part = ast.get_source_segment(self.text.strip(), node) or type(node).__name__
        why = (
            f"is too large (at most {MAX_LENGTH} items and {MAX_INTEGER_BITS}-bit integers)"
            if too_large
            else f"is refused: only numbers, strings, arithmetic, lists, tuples, list "
            f"comprehensions and {', '.join(ALLOWED_CALLS)} are evaluated"
        )
        return ExpressionError(f"{what} {part!r} in {self.text!r} {why}")

    def value(self, node: ast.AST, names: Dict[str, Any]) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self.value(node.left, names), self.value(node.right, names)
            self.check_size(node, left, right)
            return _BINARY[type(node.op)](left, right)
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
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.ListComp):
            return self.list_comprehension(node, names)
        if isinstance(node, ast.Call):
            return self.call(node, names)
        kind = "the name" if isinstance(node, ast.Name) else "the part"
        raise self.refuse(node, kind)

    def check_size(self, node: ast.BinOp, left: Any, right: Any) -> None:
        integers = all(isinstance(side, int) for side in (left, right))
        if (
            isinstance(node.op, ast.Pow)
            and integers
            and abs(left) > 1
            and left.bit_length() * right > MAX_INTEGER_BITS
        ):
            raise self.refuse(node, "the power", too_large=True)
        if (
            isinstance(node.op, ast.Mult)
            and integers
            and left.bit_length() + right.bit_length() > MAX_INTEGER_BITS
        ):
            raise self.refuse(node, "the product", too_large=True)
        if isinstance(node.op, ast.Mult) and any(
            isinstance(side, (str, list, tuple)) for side in (left, right)
        ):
            sequence, count = (
                (left, right) if isinstance(left, (str, list, tuple)) else (right, left)
            )
            if isinstance(count, int) and len(sequence) * count > MAX_LENGTH:
                raise self.refuse(node, "the repetition", too_large=True)

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
        arguments = [self.value(argument, names) for argument in node.args]
        result = ALLOWED_CALLS[node.func.id](*arguments)
        if isinstance(result, range) and len(result) > MAX_LENGTH:
            raise self.refuse(node, "the range", too_large=True)
        return result

    def list_comprehension(self, node: ast.ListComp, names: Dict[str, Any]) -> list:
        results = []
        steps = 0

        def loop(generators, bound):
            nonlocal steps
            if not generators:
                results.append(self.value(node.elt, bound))
                return
            first, rest = generators[0], generators[1:]
            if first.is_async or not isinstance(first.target, ast.Name):
                raise self.refuse(first.target, "the loop target")
            iterable = self.value(first.iter, bound)
            if not isinstance(iterable, (list, tuple, range, str)):
                raise self.refuse(first.iter, "the loop over")
            for item in iterable:
                steps += 1  # every turn of every loop, kept or not
                if steps > MAX_LENGTH:
                    raise self.refuse(node, "the list", too_large=True)
                inner = {**bound, first.target.id: item}
                if all(self.value(condition, inner) for condition in first.ifs):
                    loop(rest, inner)

        loop(node.generators, names)
        return results
