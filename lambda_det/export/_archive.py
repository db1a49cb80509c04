"""Reading the files :class:`lambda_det.export.ExportedModel` takes without running code from them.

:func:`zip_kind` tells a TorchScript file from a torch.export archive (both zip archives) by
their members, and names what else a user may have passed (a training checkpoint, other bytes).

:func:`load_program` loads a torch.export archive (``.pt2``) after :func:`check_archive`, which
refuses an archive whose loading could run code from it. It follows the layout that torch
2.14.1 writes and reads (archive version "0"; ``torch/export/pt2_archive/_package.py``:
``package_pt2`` and ``load_pt2``; ``torch/_export/serde/serialize.py``):

* the program ``models/model.json`` and the configs of weights and constants are JSON, and
  ``extra/*`` is text. Strings of the program become Python code: each ``expr_str`` is
  evaluated (``sympy.sympify``, an ``eval``, while loading), each ``guards_code`` entry run
  (``exec``, by ``ExportedProgram.module()``), and the names of inputs, nodes and attributes are
  written into the source of the program's ``forward`` (torch.fx), run while loading. Each
  expression must be of the kind torch writes (:func:`_check_expression`: sympy constructors of
  numbers and size symbols; arithmetic and comparisons of the input's sizes), and every other
  string a dotted name, but for the free text torch only keeps (:data:`TEXT_KEYS`).
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
"""

import ast
import io
import json
import re
import zipfile
from typing import Dict, Tuple

import sympy
import torch
import torch.utils._sympy.functions as torch_sympy
from torch.export.pt2_archive._package import PT2ArchiveReader, load_pt2

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


def _loads_as_tensors(data: bytes) -> bool:
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception:
        return False
    return True


def _payloads(reader: PT2ArchiveReader, path: str) -> Dict[str, bool]:
    """Every member the weight and constant configs name -> whether torch unpickles it."""
    members: Dict[str, bool] = {}
    for config_name, folder, prefix in PAYLOADS:
        try:
            config = json.loads(reader.read_string(config_name))["config"]
            entries = [
                (meta["path_name"], bool(meta.get("use_pickle"))) for meta in config.values()
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise _refuse(path, f"{config_name} is not a payload config ({error!r})") from None
        for name, pickled in entries:
            if not (isinstance(name, str) and re.fullmatch(re.escape(prefix) + r"\d+", name)):
                raise _refuse(
                    path,
                    f"{config_name} names {folder}{name}, not a {prefix}N "
                    f"tensor (other kinds are unpickled in full)",
                )
            members[folder + name] = members.get(folder + name, False) or pickled
    return members


# Strings of the program that torch evaluates as Python. The sympy expressions are sympy's
# srepr: constructors of numbers and symbols. The guards test the input's sizes, L['image'].
_SYMBOL_NAME = re.compile(r"[a-z]+\d+")  # s0, u1: torch's names of symbolic sizes
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_NUMBER_TYPES = (int, float, bool)
_GUARD_FUNCTIONS = {"IsNonOverlappingAndDenseIndicator", "cast_symbool_to_symint_guardless"}
_TENSOR_METHODS = {"size", "stride", "storage_offset", "dim", "numel"}
_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _is_sympy(name: str) -> bool:
    """A sympy class or constant (torch's sympy functions included): what sympify may build."""
    if name.startswith("_"):
        return False
    value = getattr(torch_sympy, name, None)
    value = getattr(sympy, name, None) if value is None else value
    return isinstance(value, sympy.Basic) or (
        isinstance(value, type) and issubclass(value, sympy.Basic)
    )


def _sympy_ok(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) in _NUMBER_TYPES
    if isinstance(node, ast.Name):
        return _is_sympy(node.id)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd)) and _sympy_ok(node.operand)
    if not (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and _is_sympy(node.func.id)
    ):
        return False
    args = node.args
    # Only a symbol's name or a float's digits are strings (sympy would sympify others).
    pattern = {"Symbol": _SYMBOL_NAME, "Float": _NUMBER}.get(node.func.id)
    if pattern and args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        if not pattern.fullmatch(args[0].value):
            return False
        args = args[1:]
    return all(map(_sympy_ok, args)) and all(
        keyword.arg
        and not keyword.arg.startswith("_")
        and isinstance(keyword.value, ast.Constant)
        and type(keyword.value.value) in _NUMBER_TYPES
        for keyword in node.keywords
    )


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
    if not isinstance(node, ast.Attribute) or node.attr.startswith("_"):
        return False
    if isinstance(node.value, ast.Name) and node.value.id in ("torch", "math"):
        return node.value.id == "math" or node.attr.startswith("sym_")
    return node.attr in _TENSOR_METHODS and _is_input(node.value)


def _guard_ok(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) in _NUMBER_TYPES
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


def _check_expression(text, guard: bool, path: str) -> None:
    """A string torch evaluates: an expression the grammar above admits, or a refusal."""
    what = "guards_code entry" if guard else "expr_str"
    # A guard is pasted into generated source: no comment, line break, escape or double quote.
    if not isinstance(text, str) or (guard and re.search(r'[#\\"\n\r]', text)):
        raise _refuse(path, f"its {what} {str(text)[:80]!r} is not an expression of sizes")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        tree = None
    if tree is None or not (_guard_ok if guard else _sympy_ok)(tree.body):
        raise _refuse(
            path,
            f"its {what} {text[:80]!r} is not an expression of sizes, which "
            f"torch would run as Python code",
        )


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
_NAME = re.compile(r"([A-Za-z_][\w.]*)?")


def _check_program(program, path: str) -> None:
    """The strings of the program (its JSON) that torch turns into code: expressions and names."""
    stack = [("", program)]
    while stack:
        key, value = stack.pop()
        if key == "expr_str":
            _check_expression(value, False, path)
        elif key == "guards_code":
            for text in value if isinstance(value, list) else [value]:
                _check_expression(text, True, path)
        elif isinstance(value, dict):
            stack.extend(value.items())
        elif isinstance(value, list):
            stack.extend((key, item) for item in value)
        elif isinstance(value, str) and key not in TEXT_KEYS and not _NAME.fullmatch(value):
            raise _refuse(
                path,
                f"its {MODEL} has the {key} {value[:80]!r}, not a name (torch "
                f"writes names into Python code that it runs)",
            )


def check_archive(data: bytes, path: str) -> None:
    """Refuse (ValueError, one line naming ``path`` and the member) a torch.export archive whose
    loading could run code from it, or whose layout is not torch 2.14.1's (module docstring)."""
    try:
        reader = PT2ArchiveReader(io.BytesIO(data))
    except (RuntimeError, AssertionError, UnicodeDecodeError) as error:
        raise _refuse(
            path, f"torch cannot open it as one ({' '.join(str(error).split())})"
        ) from None
    names = reader.get_file_names()
    if len({name.lower() for name in names}) != len(names):
        raise _refuse(path, "two of its members have the same name but for case")
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        raise _refuse(path, f"it has no {missing[0]}")
    version = reader.read_string("archive_version")
    if version != ARCHIVE_VERSION:
        raise _refuse(
            path,
            f"its archive version is {version[:20]!r}, and lambda_det knows the "
            f"layout of version {ARCHIVE_VERSION!r} (torch 2.14.1)",
        )
    payloads = _payloads(reader, path)
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
    try:
        program = json.loads(reader.read_string(MODEL))
    except ValueError:
        raise _refuse(path, f"its {MODEL} is not JSON") from None
    _check_program(program, path)


def load_program(path: str) -> Tuple[torch.export.ExportedProgram, Dict[str, str]]:
    """The program of the torch.export archive ``path`` and its extra files (name -> text),
    after :func:`check_archive`."""
    with open(path, "rb") as f:
        data = f.read()
    check_archive(data, path)
    contents = load_pt2(io.BytesIO(data))
    return contents.exported_programs["model"], contents.extra_files
