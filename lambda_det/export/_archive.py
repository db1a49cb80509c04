"""Reading the files :class:`lambda_det.export.ExportedModel` takes without running code from them.

:func:`zip_kind` tells a TorchScript file from a torch.export archive (both zip archives) by
their members, and names what else a user may have passed (a training checkpoint, other bytes).

:func:`load_program` loads a torch.export archive (``.pt2``) after :func:`check_archive`, which
refuses an archive whose loading could run code from it. It follows the layout that torch
2.14.1 writes and reads (archive version "0"; ``torch/export/pt2_archive/_package.py``:
``package_pt2`` and ``load_pt2``; ``torch/_export/serde/serialize.py``):

* a zip archive of plain files (no link, no folder entry, nothing compressed: torch stores
  every member as it is) under one top-level folder, each named by a relative path without
  ``.`` or ``..`` parts, seen alike by torch's zip reader and Python's;
* the program ``models/model.json`` and the configs of weights and constants are JSON, nested
  at most :data:`MAX_JSON_DEPTH` deep (so is each pytree spec in the program), and
  ``extra/*`` is text. Strings of the program become Python code: each ``expr_str`` is
  evaluated (``sympy.sympify``, an ``eval``, while loading), each ``guards_code`` entry run
  (``exec``, by ``ExportedProgram.module()``), and the names of inputs, nodes and attributes are
  written into the source of the program's ``forward`` (torch.fx), run while loading. Each
  expression must be of the kind torch writes for lambda_det's models
  (:func:`_check_expression`: the sympy constructors of numbers, size symbols, sums, products,
  divisions, clamps and comparisons; in guards, arithmetic and comparisons of the input's sizes),
  within bounds of length, depth, number size and clamps (:data:`EXPRESSION_LIMITS`); the
  archive's distinct expressions in all, within bounds of their syntax-tree nodes and of their
  clamps of two sizes (:data:`ARCHIVE_LIMITS`, checked before any is evaluated), and they
  must evaluate within :data:`EVALUATION_SECONDS` in all
  (:func:`_evaluate_expressions` builds them from the checked syntax, without ``eval``; sympy
  caches what torch then evaluates again). Every other string must be a dotted name, but for
  the free text torch only keeps (:data:`TEXT_KEYS`).
* each raw weight or constant claims at most as many elements as its member has bytes;
* a weight or constant marked ``use_pickle: false`` is raw storage bytes, read as such and never
  unpickled, whatever its first bytes;
* one marked ``use_pickle: true``, and ``data/sample_inputs/model.pt`` (empty in lambda_det's
  exports), go to ``torch.load(weights_only=False)`` (the sample inputs after a
  ``weights_only=True`` try): each must load with ``weights_only=True`` (pickle protocols 0-5
  alike) or the archive is refused;
* the constants that torch unpickles in full (``custom_obj_*``, ``opaque_obj_*``), an
  AOTInductor build (``data/aotinductor/``, a shared library), legacy ``data/*/model.pt`` files,
  any other member, two members whose names differ only in case (torch's zip reader ignores
  case), and an archive of another version, are refused.

The file is read once: the check and the load see the same bytes, through torch's own zip
reader. :func:`load_program` calls ``load_pt2``, not ``torch.export.load``, which after a
``RuntimeError`` retries the file as torch 2.7's format and loads that format's pickles in full.
Whatever the checks let through that torch still cannot load is one line naming the file.
"""

import ast
import io
import json
import math
import re
import reprlib
import stat
import time
import zipfile
from typing import Dict, Tuple

import sympy
import torch
import torch.utils._sympy.functions as torch_sympy

from lambda_det.compat.torch_features import HAS_PT2_ARCHIVE, pt2_package
from lambda_det.utils.errors import UserError

__all__ = ["ARCHIVE_VERSION", "zip_kind", "check_archive", "load_program"]

ARCHIVE_VERSION = "0"  # the pt2 archive version of torch 2.14.1, whose layout is checked here
MODEL = "models/model.json"  # torch.export.save writes one program, "model"
WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
SAMPLE_INPUTS = "data/sample_inputs/model.pt"
REQUIRED = (
    "archive_format",
    "archive_version",
    MODEL,
    WEIGHTS_CONFIG,
    CONSTANTS_CONFIG,
    SAMPLE_INPUTS,
)
OPTIONAL = ("byteorder", ".data/version", ".data/serialization_id")  # torch's zip writer's own
# The members each config may name: raw bytes, or a torch.save pickle with use_pickle.
PAYLOADS = (
    (WEIGHTS_CONFIG, "data/weights/", "weight_"),
    (CONSTANTS_CONFIG, "data/constants/", "tensor_"),
)
EXPORT_AGAIN = "export the model again with tools/export_model.py --format torch_export"


def zip_kind(path: str) -> str:
    """ "torch_export" or "torchscript": which exported file ``path`` is, by its members.

    Raises:
        ValueError: ``path`` is a torch.save checkpoint, another zip archive, or no zip archive.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = {name.split("/", 1)[-1] for name in archive.namelist()}
    except zipfile.BadZipFile:
        raise UserError(
            f"{path!r} is not an exported model: it is not a zip archive, as "
            f"TorchScript (.ts) and torch.export (.pt2) files are; pass the file "
            f"tools/export_model.py wrote (ONNX files end in .onnx)"
        ) from None
    if "archive_format" in names:
        return "torch_export"
    if "constants.pkl" in names:
        return "torchscript"
    if "data.pkl" in names:
        raise UserError(
            f"{path!r} is a PyTorch checkpoint (torch.save: weights, e.g. of "
            f"training), not an exported model: export it with "
            f"tools/export_model.py --format torch_export (or torchscript, onnx) "
            f"MODEL.WEIGHTS {path}, and pass the file that writes"
        )
    raise UserError(
        f"{path!r} is a zip archive but neither a TorchScript nor a torch.export "
        f"file: pass the file tools/export_model.py wrote"
    )


def _refuse(path: str, reason: str) -> UserError:
    return UserError(
        f"{path!r} is not a torch.export archive lambda_det loads: {reason}; {EXPORT_AGAIN}"
    )


MAX_JSON_DEPTH = 64  # torch writes 17 levels for lambda_det's Mask R-CNN


def _read_json(text, path: str, what: str):
    """``text`` (bytes or str) as JSON, nested at most :data:`MAX_JSON_DEPTH` deep, or a
    refusal naming ``path`` and ``what`` (torch reads its JSON with recursive functions)."""
    try:
        value = json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except RecursionError:
        raise _refuse(path, f"its {what} is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError too
        raise _refuse(
            path, f"its {what} is not JSON ({' '.join(str(error).split())[:80]})"
        ) from None
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _refuse(path, f"its {what} is nested deeper than {MAX_JSON_DEPTH} levels")
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        stack.extend((child, depth + 1) for child in children)
    return value


def _check_members(data: bytes, path: str) -> Dict[str, int]:
    """The archive's members, under its top-level folder -> their sizes, as Python's zip reader
    sees them: plain files stored as they are, each named by a relative path, under one folder."""
    try:
        infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as error:
        raise _refuse(path, f"it is not a zip archive ({error})") from None
    members, folders = {}, set()
    for info in infos:
        name = info.filename
        parts = name.split("/")
        kind = stat.S_IFMT(info.external_attr >> 16)
        if name.startswith("/") or "\\" in name or ":" in parts[0]:
            problem = "is an absolute path"
        elif name.endswith("/"):
            problem = "is a folder, not a file"
        elif len(parts) < 2 or any(part in ("", ".", "..") for part in parts):
            problem = "is not a relative path under the archive's folder"
        elif kind not in (0, stat.S_IFREG):
            problem = "is a symbolic link" if kind == stat.S_IFLNK else "is not a plain file"
        elif info.compress_type != zipfile.ZIP_STORED:
            problem = "is compressed (torch stores every member as it is)"
        elif name.split("/", 1)[1] in members:
            problem = "is there twice"
        else:
            members[name.split("/", 1)[1]] = info.file_size
            folders.add(parts[0])
            continue
        raise _refuse(path, f"its member {name[:200]!r} {problem}")
    if len(folders) > 1:
        shown = ", ".join(sorted(folders)[:3])
        raise _refuse(
            path, f"its members are under {len(folders)} top-level folders ({shown}), not one"
        )
    if sum(members.values()) > len(data):
        raise _refuse(path, "its members claim more bytes than the file holds")
    return members


def _shown(value) -> str:
    """A name or version read from the archive, as an error shows it: text as it is (cut
    short), anything else (bytes that are no utf-8 text, a number) as its repr."""
    if isinstance(value, bytes):
        try:
            value = repr(value.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    return value[:80] if isinstance(value, str) else reprlib.repr(value)


def _loads_as_tensors(data: bytes) -> bool:
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception:
        return False
    return True


def _numel(sizes) -> int:
    """The number of elements of a tensor_meta's sizes ([{"as_int": n}, ...]); -1 if not ints."""
    dims = [size.get("as_int") if isinstance(size, dict) else None for size in sizes]
    if not all(type(dim) is int and dim >= 0 for dim in dims):
        return -1
    return math.prod(dims)


def _payloads(reader, path: str, sizes: Dict[str, int]) -> Dict[str, bool]:
    """Every member the weight and constant configs name -> whether torch unpickles it. A raw
    member (torch reads its bytes as a tensor) must hold a byte for each element its tensor
    claims, an empty one none: torch makes the tensor of an empty member with torch.zeros."""
    members: Dict[str, bool] = {}
    for config_name, folder, prefix in PAYLOADS:
        config = _read_json(reader.read_bytes(config_name), path, config_name)
        try:
            entries = [
                (
                    meta["path_name"],
                    bool(meta.get("use_pickle")),
                    (meta.get("tensor_meta") or {}).get("sizes", []),
                )
                for meta in config["config"].values()
            ]
        except (KeyError, TypeError, AttributeError) as error:
            raise _refuse(path, f"{config_name} is not a payload config ({error!r})") from None
        for name, pickled, tensor_sizes in entries:
            if not (isinstance(name, str) and re.fullmatch(re.escape(prefix) + r"\d+", name)):
                raise _refuse(
                    path,
                    f"{config_name} names {folder}{_shown(name)}, not a {prefix}N "
                    f"tensor (other kinds are unpickled in full)",
                )
            member = folder + name
            if member not in sizes:
                raise _refuse(path, f"{config_name} names {member}, which it does not hold")
            numel = _numel(tensor_sizes) if isinstance(tensor_sizes, list) else -1
            if not pickled and not 0 <= numel <= sizes[member]:
                raise _refuse(
                    path,
                    f"{config_name} gives {member} a tensor of {reprlib.repr(tensor_sizes)} "
                    f"sizes, more elements than the member's {sizes[member]:,} bytes hold",
                )
            members[member] = members.get(member, False) or pickled
    return members


# Strings of the program that torch evaluates as Python. The sympy expressions are sympy's
# srepr: constructors of numbers and symbols. The guards test the input's sizes, L['image'].
_SYMBOL_NAME = re.compile(r"[a-z]+\d+")  # s0, u1: torch's names of symbolic sizes
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_NUMBER_TYPES = (int, float, bool)
# What torch writes in expr_str for lambda_det's models (Symbol, Integer, Add, Mul,
# FloorDiv, IntTrueDiv, Max, Min, LessThan, GreaterThan), with the other comparisons,
# divisions and remainders of sizes it writes so and the constants of sympy's srepr: each is
# as cheap as its arguments.
# Powers, factorials and other functions are not written for sizes, and can take hours.
_SYMPY_NAMES = {
    "Symbol",
    "Integer",
    "Rational",
    "Float",
    "Add",
    "Mul",
    "FloorDiv",
    "CeilDiv",
    "CleanDiv",
    "Mod",
    "PythonMod",
    # torch's own size functions: divisions (RetinaNet's anchors write IntTrueDiv), roundings
    # and conversions, one argument or two each.
    "IntTrueDiv",
    "FloatTrueDiv",
    "TruncToInt",
    "FloorToInt",
    "CeilToInt",
    "RoundToInt",
    "ToFloat",
    "TruncToFloat",
    "Max",
    "Min",
    "Equality",
    "Unequality",
    "StrictLessThan",
    "LessThan",
    "StrictGreaterThan",
    "GreaterThan",
    "And",
    "Or",
    "Not",
    "oo",
    "true",
    "false",
}
# What torch writes in guards_code: torch.sym_max and torch.sym_min of sizes, the sizes
# themselves, and the few functions torch prints for size arithmetic.
_GUARD_FUNCTIONS = {"IsNonOverlappingAndDenseIndicator", "cast_symbool_to_symint_guardless"}
_GUARD_MODULE_FUNCTIONS = {
    "torch": {"sym_max", "sym_min", "sym_float", "sym_int", "sym_not", "sym_ite"},
    "math": {"floor", "ceil", "trunc"},
}
_TENSOR_METHODS = {"size", "stride", "storage_offset", "dim", "numel"}
_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)  # no ** (powers)
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
# Bounds of one expression (what torch writes for lambda_det's Mask R-CNN: 1,185 characters, a
# syntax tree 17 deep, numbers up to 12,288, up to 6 clamps, each of a number and a size).
EXPRESSION_LIMITS = {
    "characters": 8_000,
    "depth": 64,  # of its syntax tree
    "number": 2**64,  # the magnitude of each number in it
    "float digits": 32,  # of a sympy Float's string
    "float precision": 64,  # bits
    "clamps": 8,  # Max and Min, of two arguments each
}
# Bounds of the archive's distinct expressions in all, checked before any is evaluated (what
# torch writes for lambda_det's Mask R-CNN: 199 expressions of 10,468 syntax-tree nodes, 158
# clamps, none of two sizes; they evaluate in 0.4 to 0.8 s). A clamp of two arguments that both
# hold a size (Max(a*s0 - b*s1, c*s2 - d*s3)) is what sympy must compare symbolically: a nest of
# 8 takes 0.6 s, each one more about twice as long.
ARCHIVE_LIMITS = {
    "nodes": 40_000,
    "clamps of two sizes": 4,
}
# A last bound on the evaluation itself, should the bounds above let slow work through.
EVALUATION_SECONDS = 10.0


def _is_number(value) -> bool:
    return type(value) in _NUMBER_TYPES and (
        abs(value) <= EXPRESSION_LIMITS["number"]
        if type(value) is int
        else math.isfinite(value) and abs(value) <= EXPRESSION_LIMITS["number"]
    )


def _float_ok(args, keywords) -> bool:
    """Float('1.5', precision=53): a short decimal within the number bound, a small precision."""
    if not (len(args) == 1 and isinstance(args[0], ast.Constant)):
        return False
    digits = args[0].value
    if isinstance(digits, str):
        if len(digits) > EXPRESSION_LIMITS["float digits"] or not _NUMBER.fullmatch(digits):
            return False
        digits = float(digits)
    return _is_number(digits) and all(
        keyword.arg == "precision"
        and isinstance(keyword.value, ast.Constant)
        and type(keyword.value.value) is int
        and 1 <= keyword.value.value <= EXPRESSION_LIMITS["float precision"]
        for keyword in keywords
    )


def _sympy_ok(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return _is_number(node.value)
    if isinstance(node, ast.Name):
        return node.id in ("oo", "true", "false")
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd)) and _sympy_ok(node.operand)
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _SYMPY_NAMES
    ):
        return False
    name, args = node.func.id, node.args
    if name == "Float":
        return _float_ok(args, node.keywords)
    if name == "Symbol":  # Symbol('s0', positive=True, integer=True)
        return (
            len(args) == 1
            and isinstance(args[0], ast.Constant)
            and isinstance(args[0].value, str)
            and _SYMBOL_NAME.fullmatch(args[0].value) is not None
            and all(
                keyword.arg
                and not keyword.arg.startswith("_")
                and isinstance(keyword.value, ast.Constant)
                and type(keyword.value.value) is bool
                for keyword in node.keywords
            )
        )
    if name in ("Max", "Min") and len(args) != 2:
        return False
    return not node.keywords and all(map(_sympy_ok, args))


def _is_input(node: ast.AST) -> bool:
    """L['image'] (or L['a'][0]): an input of the program, as the guards name it."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and type(node.slice.value) in (str, int)
        and re.fullmatch(r"\w+", str(node.slice.value)) is not None
        and (isinstance(node.value, ast.Name) and node.value.id == "L" or _is_input(node.value))
    )


def _guard_function(node: ast.AST) -> bool:
    """torch.sym_max, math.floor, L['image'].size, ... (what a guard may call)."""
    if isinstance(node, ast.Name):
        return node.id in _GUARD_FUNCTIONS
    if not isinstance(node, ast.Attribute):
        return False
    if isinstance(node.value, ast.Name) and node.value.id in _GUARD_MODULE_FUNCTIONS:
        return node.attr in _GUARD_MODULE_FUNCTIONS[node.value.id]
    return node.attr in _TENSOR_METHODS and _is_input(node.value)


def _guard_ok(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return _is_number(node.value)
    if isinstance(node, ast.Name):
        return node.id == "inf"
    if isinstance(node, ast.BoolOp):
        return all(map(_guard_ok, node.values))
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, _ARITHMETIC) and _guard_ok(node.left) and _guard_ok(node.right)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)) and _guard_ok(node.operand)
    if isinstance(node, ast.Compare):
        return all(isinstance(op, _COMPARISONS) for op in node.ops) and all(
            map(_guard_ok, [node.left, *node.comparators])
        )
    if isinstance(node, ast.Call):
        return not node.keywords and _guard_function(node.func) and all(map(_guard_ok, node.args))
    if isinstance(node, ast.Subscript):  # L['image'].size()[1]
        return (
            isinstance(node.value, ast.Call)
            and _guard_ok(node.value)
            and isinstance(node.slice, ast.Constant)
            and type(node.slice.value) is int
        )
    return False


def _tree_depth(tree: ast.AST) -> int:
    """The depth of a syntax tree, counted without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _clamps(tree: ast.AST) -> int:
    return sum(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("Max", "Min")
        for node in ast.walk(tree)
    )


def _check_expression(text, guard: bool, path: str) -> ast.Expression:
    """A string torch evaluates: an expression the grammar above admits within
    :data:`EXPRESSION_LIMITS` (its syntax tree), or a refusal."""
    what = "guards_code entry" if guard else "expr_str"
    # A guard is pasted into generated source: no comment, line break, escape or double quote.
    if not isinstance(text, str) or (guard and re.search(r'[#\\"\n\r]', text)):
        raise _refuse(path, f"its {what} {str(text)[:80]!r} is not an expression of sizes")
    limits = EXPRESSION_LIMITS
    bound = None
    if len(text) > limits["characters"]:
        bound = f"is {len(text):,} characters long, more than {limits['characters']:,}"
    else:
        try:
            tree = ast.parse(text, mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError):  # the parser's stack
            tree = None
        if tree is not None and _tree_depth(tree) > limits["depth"]:
            bound = f"is nested deeper than {limits['depth']} levels"
        elif tree is not None and not guard and _clamps(tree) > limits["clamps"]:
            bound = f"has more than {limits['clamps']} clamps (Max, Min)"
    if bound is not None:
        raise _refuse(path, f"its {what} {text[:80]!r}... {bound}")
    if tree is None or not (_guard_ok if guard else _sympy_ok)(tree.body):
        raise _refuse(
            path,
            f"its {what} {text[:80]!r} is not an expression of sizes within lambda_det's "
            f"bounds (functions and numbers torch writes for sizes, numbers up to "
            f"{limits['number']:.3g}), which torch would run as Python code",
        )
    return tree


def _sympy_value(node: ast.AST):
    """The sympy value of a checked expression's node, built as sympify's eval would."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return _SYMPY_VALUES[node.id]
    if isinstance(node, ast.UnaryOp):
        operand = _sympy_value(node.operand)
        return -operand if isinstance(node.op, ast.USub) else +operand
    keywords = {keyword.arg: keyword.value.value for keyword in node.keywords}
    return _SYMPY_VALUES[node.func.id](*map(_sympy_value, node.args), **keywords)


def _sympy_namespace() -> dict:
    """What the names of _SYMPY_NAMES are when torch sympifies: torch's functions first."""
    return {
        name: getattr(torch_sympy, name) if name in torch_sympy.__all__ else getattr(sympy, name)
        for name in _SYMPY_NAMES
    }


_SYMPY_VALUES = _sympy_namespace()


def _holds_a_size(node: ast.AST) -> bool:
    return any(
        isinstance(child, ast.Call)
        and isinstance(child.func, ast.Name)
        and child.func.id == "Symbol"
        for child in ast.walk(node)
    )


def _clamps_of_sizes(tree: ast.AST) -> int:
    """The clamps (Max, Min) in ``tree`` whose two arguments both hold a size."""
    return sum(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("Max", "Min")
        and all(map(_holds_a_size, node.args))
        for node in ast.walk(tree)
    )


def _check_work(trees: Dict[str, ast.Expression], path: str) -> None:
    """Refuse, before evaluating any, expressions whose evaluation would take long in all
    (:data:`ARCHIVE_LIMITS`: their syntax-tree nodes, their clamps of two sizes)."""
    limits = ARCHIVE_LIMITS
    nodes = sum(sum(1 for _ in ast.walk(tree)) for tree in trees.values())
    if nodes > limits["nodes"]:
        raise _refuse(
            path,
            f"its {len(trees):,} size expressions have {nodes:,} syntax-tree nodes in all, "
            f"more than lambda_det's bounds allow ({limits['nodes']:,})",
        )
    compared = sum(map(_clamps_of_sizes, trees.values()))
    if compared > limits["clamps of two sizes"]:
        raise _refuse(
            path,
            f"its expr_str values hold {compared:,} clamps (Max, Min) of two sizes in all, "
            f"more than lambda_det's bounds allow ({limits['clamps of two sizes']}): sympy "
            f"compares each symbolically, in time that doubles with each nested one",
        )


def _evaluate_expressions(trees: Dict[str, ast.Expression], path: str) -> None:
    """Evaluate each distinct expr_str once, after :func:`_check_work` and within
    :data:`EVALUATION_SECONDS` in all, or refuse: what torch evaluates while loading, then
    from sympy's cache."""
    _check_work(trees, path)
    deadline = time.monotonic() + EVALUATION_SECONDS
    for count, (text, tree) in enumerate(trees.items()):
        if time.monotonic() > deadline:
            raise _refuse(
                path,
                f"evaluating its {len(trees):,} size expressions takes more than "
                f"{EVALUATION_SECONDS:g} s ({count:,} done)",
            )
        try:
            _sympy_value(tree.body)
        except (ArithmeticError, TypeError, ValueError, AttributeError) as error:
            raise _refuse(
                path,
                f"its expr_str {text[:80]!r} cannot be evaluated ({type(error).__name__})",
            ) from None


# The program's strings that torch keeps as data (messages, stack traces, module paths, pytree
# specs parsed as JSON), not as code. Strings under every other key must be _NAME.
TEXT_KEYS = {
    "as_string",
    "as_strings",
    "stack_trace",
    "nn_module_stack",
    "torch_fn",
    "torch_version",
    "in_spec",
    "out_spec",
}
PYTREE_SPECS = {"in_spec", "out_spec"}  # JSON in a string, read by recursive functions
_NAME = re.compile(r"([A-Za-z_][\w.]*)?")


def _check_program(program, path: str) -> Dict[str, ast.Expression]:
    """The strings of the program (its JSON) that torch turns into code: expressions and names.
    Returns the distinct expr_str's syntax trees."""
    expressions: Dict[str, ast.Expression] = {}
    stack = [("", program)]
    while stack:
        key, value = stack.pop()
        if key == "expr_str":
            if value not in expressions:
                expressions[value] = _check_expression(value, False, path)
        elif key == "guards_code":
            for text in value if isinstance(value, list) else [value]:
                _check_expression(text, True, path)
        elif isinstance(value, dict):
            stack.extend(value.items())
        elif isinstance(value, list):
            stack.extend((key, item) for item in value)
        elif key in PYTREE_SPECS and isinstance(value, str):
            _read_json(value, path, f"{MODEL}'s {key}")
        elif isinstance(value, str) and key not in TEXT_KEYS and not _NAME.fullmatch(value):
            raise _refuse(
                path,
                f"its {MODEL} has the {key} {value[:80]!r}, not a name (torch "
                f"writes names into Python code that it runs)",
            )
    return expressions


def check_archive(data: bytes, path: str) -> None:
    """Refuse (ValueError, one line naming ``path`` and the member) a torch.export archive whose
    loading could run code from it, or whose layout is not torch 2.14.1's (module docstring)."""
    if not HAS_PT2_ARCHIVE:
        raise UserError(
            f"{path!r}: this torch ({torch.__version__}) has no torch.export.pt2_archive, the "
            "reader lambda_det checks a .pt2 with; use torch>=2.8 to read it"
        )
    sizes = _check_members(data, path)
    try:
        reader = pt2_package.PT2ArchiveReader(io.BytesIO(data))
        names = reader.get_file_names()
    except (RuntimeError, AssertionError, UnicodeDecodeError) as error:
        raise _refuse(
            path, f"torch cannot open it as one ({' '.join(str(error).split())[:200]})"
        ) from None
    if sorted(names) != sorted(sizes):
        raise _refuse(path, "torch's zip reader and Python's see other members in it")
    if len({name.lower() for name in names}) != len(names):
        raise _refuse(path, "two of its members have the same name but for case")
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        raise _refuse(path, f"it has no {missing[0]}")
    version = reader.read_bytes("archive_version")
    if version != ARCHIVE_VERSION.encode():
        raise _refuse(
            path,
            f"its archive version is {_shown(version)}, and lambda_det knows the "
            f"layout of version {ARCHIVE_VERSION!r} (torch 2.14.1)",
        )
    payloads = _payloads(reader, path, sizes)
    known = set(REQUIRED) | set(OPTIONAL) | set(payloads)
    unknown = [name for name in names if name not in known and not name.startswith("extra/")]
    if unknown:
        raise _refuse(path, f"its member {unknown[0]} is not one of torch.export.save's layout")
    pickled = [name for name, pickled in payloads.items() if pickled]
    if reader.read_bytes(SAMPLE_INPUTS):
        pickled.append(SAMPLE_INPUTS)
    for name in pickled:
        if not _loads_as_tensors(reader.read_bytes(name)):
            raise UserError(
                f"{path!r}: {name} holds objects other than tensors and plain "
                f"containers, which loading would unpickle by running code; "
                f"refusing to load it ({EXPORT_AGAIN})"
            )
    for name in names:
        if name.startswith("extra/"):
            try:
                reader.read_bytes(name).decode("utf-8")
            except UnicodeDecodeError:
                raise _refuse(path, f"its member {name} is not utf-8 text") from None
    program = _read_json(reader.read_bytes(MODEL), path, MODEL)
    _evaluate_expressions(_check_program(program, path), path)


# What torch raises for an archive it cannot load (a program that does not deserialize, a
# weight whose strides leave its storage): the file, not the caller, is wrong.
LOAD_ERRORS = (
    RuntimeError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    AssertionError,
    ArithmeticError,
    RecursionError,
)


def load_program(path: str) -> Tuple[torch.export.ExportedProgram, Dict[str, str]]:
    """The program of the torch.export archive ``path`` and its extra files (name -> text),
    after :func:`check_archive`."""
    with open(path, "rb") as f:
        data = f.read()
    check_archive(data, path)
    try:
        contents = pt2_package.load_pt2(io.BytesIO(data))
        program = contents.exported_programs["model"]
    except LOAD_ERRORS as error:
        raise _refuse(
            path, f"torch cannot load it ({type(error).__name__}: {_first_line(error)})"
        ) from None
    return program, contents.extra_files


def _first_line(error: Exception) -> str:
    return " ".join(str(error).split())[:200]
