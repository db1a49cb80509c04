"""ExportedModel loads a torch.export archive (.pt2) by its layout (lambda_det.export._archive):
raw weights whatever their first bytes, and never code from the file.

A tiny detector-shaped model is exported once per module (export_model, torch_export) with
weights whose raw bytes begin like pickles and zips; crafted archives are copies of that file
with members rewritten (the tests that read it are marked slow: the export takes seconds).
Each crafted payload has its negative control: plain ``torch.export.load`` of the same archive
runs it (the marker file appears).
"""

import contextlib
import io
import json
import logging
import math
import multiprocessing
import os
import pickle
import stat
import struct
import time
import warnings
import zipfile
from pathlib import Path

import pytest
import sympy
import torch
from conftest import Payload
from detectron2.structures import Boxes, Instances

from lambda_det.export import (
    METADATA_NAME,
    ExportedModel,
    _archive,
    eager_outputs,
    export_model,
    metadata_path,
)
from lambda_det.export._archive import _check_expression

# The first raw bytes of one weight each: pickle protocols 1-5 (PROTO n, then BININT1 1),
# protocol 0 (GLOBAL "cos", MARK "(dp0") and a zip's local header. All are small finite floats.
PREFIXES = [b"\x80" + bytes([protocol]) + b"K\x01" for protocol in range(1, 6)] + [
    b"cos\n",
    b"(dp0",
    b"PK\x03\x04",
]
CONSTANT_PREFIX = b"\x80\x02K\x01"  # the constant (a non-persistent buffer) begins so too
PROTOCOLS = [0, 1, 2, 3, 4, 5]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Detector(torch.nn.Module):
    """[{"image"}] -> [{"instances"}] with boxes and scores: what export_model takes, in a
    second. Each of ``weights`` begins with one of PREFIXES."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.rand(4) + 0.5) for _ in PREFIXES
        )
        self.register_buffer("scale", torch.tensor([1.0, 2.0, 1.0, 2.0]), persistent=False)
        with torch.no_grad():
            for weight, prefix in zip(self.weights, PREFIXES):
                weight[0] = struct.unpack("<f", prefix)[0]
            self.scale[0] = struct.unpack("<f", CONSTANT_PREFIX)[0]

    def forward(self, inputs):
        image = inputs[0]["image"].float()
        features = self.conv(image[None]).mean(dim=(2, 3))  # 1 x 4
        boxes = features.abs() * self.scale
        for weight in self.weights:
            boxes = boxes + weight
        instances = Instances(
            tuple(image.shape[1:]), pred_boxes=Boxes(boxes), scores=features[:, 0]
        )
        return [{"instances": instances}]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Detector().eval()


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("export") / "model.pt2"
    export_model(model, torch.zeros(3, 8, 8, dtype=torch.uint8), path, "torch_export")
    return path


def read_members(path: Path) -> dict:
    """Member name (under the archive's root folder) -> bytes."""
    with zipfile.ZipFile(path) as archive:
        return {name.split("/", 1)[1]: archive.read(name) for name in archive.namelist()}


def rewrite(source: Path, target: Path, changes: dict) -> Path:
    """A copy of the archive ``source`` with ``changes`` (member -> bytes, or None: left out)."""
    members = {**read_members(source), **changes}
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in members.items():
            if data is not None:
                archive.writestr(f"archive/{name}", data)
    return target


def pickled_entry(source: Path, config: str) -> tuple:
    """The config ``config`` with its first entry marked use_pickle, that entry's member and
    name."""
    payload_config = json.loads(read_members(source)[config])
    name, entry = next(iter(payload_config["config"].items()))
    entry["use_pickle"] = True
    member = f"{config.rsplit('/', 1)[0]}/{entry['path_name']}"
    return json.dumps(payload_config).encode(), member, name


def torch_export_load_runs_code(path: Path, marker: Path) -> bool:
    """The negative control: torch.export.load (and running the program) without the check."""
    with contextlib.suppress(Exception):
        torch.export.load(str(path)).module()(torch.zeros(3, 8, 8, dtype=torch.uint8))
    return marker.exists()


@pytest.mark.slow
def test_raw_weights_that_begin_like_pickles_load(model, exported):
    """use_pickle: false members are raw storage: loaded whatever their first bytes."""
    members = read_members(exported)
    config = json.loads(members["data/weights/model_weights_config.json"])["config"]
    assert not any(entry["use_pickle"] for entry in config.values())
    firsts = {data[:4] for name, data in members.items() if name.startswith("data/")}
    assert set(PREFIXES) | {CONSTANT_PREFIX} <= firsts  # the crafted weights are in the file
    loaded = ExportedModel(exported)
    for size in [(8, 8), (5, 11)]:
        image = torch.randint(0, 256, (3, *size), dtype=torch.uint8)
        expected, actual = eager_outputs(model, image), loaded(image)
        assert sorted(actual) == sorted(expected) == ["image_size", "pred_boxes", "scores"]
        for name in expected:
            assert torch.equal(actual[name], expected[name]), name


def payload(marker: Path, protocol: int, container: bool = False) -> bytes:
    return pickle.dumps([Payload(marker)] if container else Payload(marker), protocol=protocol)


PAYLOADS = [pytest.param(protocol, False, id=f"protocol{protocol}") for protocol in PROTOCOLS] + [
    pytest.param(0, True, id="protocol0-list")
]  # begins with "(" (MARK)


@pytest.mark.slow
@pytest.mark.parametrize("protocol, container", PAYLOADS)
@pytest.mark.parametrize("place", ["use_pickle weight", "sample inputs", "use_pickle constant"])
def test_pickles_that_would_run_code_are_refused(place, protocol, container, exported, tmp_path):
    marker = tmp_path / "code_ran"
    data = payload(marker, protocol, container)
    assert data[:1] in (b"\x80", b"c", b"(")
    if place == "sample inputs":
        member, changes = "data/sample_inputs/model.pt", {}
    else:
        config = {
            "use_pickle weight": "data/weights/model_weights_config.json",
            "use_pickle constant": "data/constants/model_constants_config.json",
        }[place]
        config_data, member, _ = pickled_entry(exported, config)
        changes = {config: config_data}
    crafted = rewrite(exported, tmp_path / "model.pt2", {**changes, member: data})
    with pytest.raises(ValueError, match=f"{member} holds objects other than tensors"):
        ExportedModel(crafted)
    assert not marker.exists()
    assert torch_export_load_runs_code(crafted, marker)


@pytest.mark.slow
def test_pickled_tensors_load(model, exported, tmp_path):
    """A use_pickle weight that is a tensor (torch.save), and sample inputs of tensors, load."""
    config_data, member, name = pickled_entry(exported, "data/weights/model_weights_config.json")
    weight = torch.nn.Parameter(model.state_dict()[name.replace("adapter.model.", "", 1)])
    changes = {"data/weights/model_weights_config.json": config_data}
    for member_name, value in (
        (member, weight),
        ("data/sample_inputs/model.pt", ((torch.zeros(3, 8, 8),), {})),
    ):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        changes[member_name] = buffer.getvalue()
    loaded = ExportedModel(rewrite(exported, tmp_path / "model.pt2", changes))
    image = torch.randint(0, 256, (3, 6, 7), dtype=torch.uint8)
    assert torch.equal(loaded(image)["pred_boxes"], eager_outputs(model, image)["pred_boxes"])


@pytest.mark.slow
def test_opaque_constants_are_refused(exported, tmp_path):
    """opaque_obj_* constants go to pickle.loads: no member kind of lambda_det's layout."""
    marker = tmp_path / "code_ran"
    config_name = "data/constants/model_constants_config.json"
    config = json.loads(read_members(exported)[config_name])
    config["config"]["evil"] = {
        "path_name": "opaque_obj_0",
        "is_param": False,
        "use_pickle": True,
        "tensor_meta": None,
    }
    crafted = rewrite(
        exported,
        tmp_path / "model.pt2",
        {
            config_name: json.dumps(config).encode(),
            "data/constants/opaque_obj_0": payload(marker, 2),
        },
    )
    with pytest.raises(ValueError, match="names data/constants/opaque_obj_0, not a tensor_N"):
        ExportedModel(crafted)
    assert not marker.exists()
    assert torch_export_load_runs_code(crafted, marker)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["guards_code", "expr_str", "name"])
def test_program_strings_that_torch_evaluates_are_checked(where, exported, tmp_path):
    """guards_code is exec'd by ExportedProgram.module() (and run by the module), expr_str
    sympify'd (eval) at load, and the input's name written into forward's source (torch.fx):
    image=<code> is a default value, evaluated at load."""
    marker = tmp_path / "code_ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch() is None"
    program = json.loads(read_members(exported)["models/model.json"])
    changes = {}
    if where == "guards_code":
        program["guards_code"] = [code]
        # torch makes the guards a function only for a program with sample inputs (tensors).
        buffer = io.BytesIO()
        torch.save(((torch.zeros(3, 8, 8, dtype=torch.uint8),), {}), buffer)
        changes["data/sample_inputs/model.pt"] = buffer.getvalue()
    elif where == "expr_str":
        text = json.dumps(program)
        symbol = "Symbol('s62', positive=True, integer=True)"
        assert symbol in text
        program = json.loads(text.replace(symbol, code, 1))
    else:
        text = json.dumps(program)
        assert '"image"' in text
        program = json.loads(text.replace('"image"', json.dumps(f"image={code}")))
    changes["models/model.json"] = json.dumps(program).encode()
    crafted = rewrite(exported, tmp_path / "model.pt2", changes)
    message = (
        r"has the \w+ .* not a name"
        if where == "name"
        else f"its {where} .* is not an expression of sizes"
    )
    with pytest.raises(ValueError, match=message):
        ExportedModel(crafted)
    assert not marker.exists()
    assert torch_export_load_runs_code(crafted, marker)


LAYOUTS = {
    "AOTInductor build": (
        {"data/aotinductor/model/model.so": b"\x7fELF"},
        "member data/aotinductor/model/model.so is not one of",
    ),
    "legacy weights": (
        {"data/weights/model.pt": b"\x80\x02K\x01."},
        "member data/weights/model.pt is not one of",
    ),
    "unreferenced pickle": (
        {"data/weights/weight_99": b"\x80\x02K\x01."},
        "member data/weights/weight_99 is not one of",
    ),
    "other version": ({"archive_version": b"1"}, "archive version is '1'"),
    "missing config": (
        {"data/weights/model_weights_config.json": None},
        "it has no data/weights/model_weights_config.json",
    ),
    "names equal but for case": ({"Models/model.json": b"{}"}, "same name but for case"),
    "unknown constant kind": (
        {
            "data/constants/model_constants_config.json": json.dumps(
                {
                    "config": {
                        "x": {
                            "path_name": "custom_obj_0",
                            "is_param": False,
                            "use_pickle": True,
                            "tensor_meta": None,
                        }
                    }
                }
            ).encode(),
            "data/constants/custom_obj_0": b"",
        },
        "names data/constants/custom_obj_0, not a tensor_N",
    ),
    "config not JSON": (
        {"data/weights/model_weights_config.json": b"\x80\x02"},
        "its data/weights/model_weights_config.json is not JSON",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_unknown_layouts_are_refused(case, exported, tmp_path):
    changes, message = LAYOUTS[case]
    with pytest.raises(ValueError, match=message) as error:
        ExportedModel(rewrite(exported, tmp_path / "model.pt2", changes))
    assert "\n" not in str(error.value) and "model.pt2" in str(error.value)


@pytest.mark.parametrize("case", ["checkpoint", "random bytes", "other zip"])
def test_files_that_are_no_exported_model_are_named(case, tmp_path):
    path = tmp_path / ("model_final.pth" if case == "checkpoint" else "model.pt2")
    if case == "checkpoint":
        torch.save({"model": {"weight": torch.zeros(2)}, "iteration": 3}, path)
    elif case == "random bytes":
        path.write_bytes(
            torch.randint(
                0, 256, (2000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
            ).numpy()
        )
    else:
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("notes/readme.txt", "hello")
    message = {
        "checkpoint": "is a PyTorch checkpoint .* MODEL.WEIGHTS .*model_final.pth",
        "random bytes": "is not an exported model: it is not a zip archive",
        "other zip": "neither a TorchScript nor a torch.export file",
    }[case]
    with pytest.raises(ValueError, match=message) as error:
        ExportedModel(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)


# What torch 2.14.1 writes for lambda_det's Mask R-CNN (the first guard is cut short).
GOOD_GUARDS = [
    "0 <= ((-1)*torch.sym_min(100, 3*((31 + L['image'].size()[1]) // 32)*((31 + L['image'].size()"
    "[2]) // 32))) + 3*((31 + L['image'].size()[1]) // 32)*((31 + L['image'].size()[2]) // 32)",
    "(((1 + (((-1) + ((31 + L['image'].size()[2]) // 32)) // 2))*(12 + 12*(((-1) + ((31 + "
    "L['image'].size()[1]) // 32)) // 2))) % 4) == 0 or 3 <= L['image'].size()[1]",
]
GOOD_EXPRESSIONS = [
    "Symbol('s62', positive=True, integer=True)",
    "Mul(Integer(64), Max(Integer(1), Mul(Integer(2), FloorDiv(Add(Symbol('s62', positive=True, "
    "integer=True), Integer(31)), Integer(32)))))",
    "Add(Symbol('u0', integer=True), Integer(-1))",
    "Float('1.5', precision=53)",
    "oo",
]
BAD_GUARDS = [
    "__import__('os').system('true')",
    "L['image'].size()[1] > 0 or open('x')",
    "L['image'].__class__",
    "torch.save(L['image'], 'x') is None",
    "getattr(L, 'x')",
    "L['image'].size()[1] # comment",
    "L['a\"b'].size()[0] > 0",
    "(1\n)",
    "math.floor(L['image'].size()[1]).__class__",
    "[c for c in ()]",
    "lambda: 1",
    "L['image'].size()[1] ** 2 > 0",
    "math.factorial(5) > 0",
    "math.gcd(4, 6) > 0",
    "L['image'].size()[1] < 1e400",
    "L['image'].size()[1] < 99999999999999999999",
    "torch.sym_sum([1]) > 0",
]
BAD_EXPRESSIONS = [
    "__import__('os')",
    "Symbol('x; import os')",
    "Max(Integer(1), '__import__(\"os\")')",
    "lambdify(Symbol('s0'), Integer(1))",
    "sympify('1')",
    "Integer(1).__class__",
    "Symbol('s0', **{})",
    "Float('1e5; x')",
    "Function('f')(Integer(1))",
    "1 + 1",
    "factorial(Integer(5))",
    "Pow(Integer(2), Integer(3))",
    "PowByNatural(Integer(2), Integer(3))",
    "Float('1e400', precision=53)",
    "Float('1.5', precision=100000)",
    "Float('" + "1" * 40 + "', precision=53)",
    "Integer(99999999999999999999)",
    "Max(Integer(1), Integer(2), Integer(3))",
    "Symbol('s0', positive=1)",
]


@pytest.mark.parametrize("guard", [True, False])
def test_expression_grammar(guard, tmp_path):
    """What torch writes passes; what could run code (or call anything else) is refused."""
    good, bad = (GOOD_GUARDS, BAD_GUARDS) if guard else (GOOD_EXPRESSIONS, BAD_EXPRESSIONS)
    for text in good:
        _check_expression(text, guard, "model.pt2")
    for text in bad + [42, ["1"]]:
        with pytest.raises(ValueError, match="is not an expression of sizes"):
            _check_expression(text, guard, "model.pt2")


# ---- archives that torch reads past their bounds: members, versions, JSON, sizes ----


def torch_export_load(path: Path):
    """The negative control: torch.export.load without the checks; the program, or what it
    raised (a library error, as a traceback)."""
    try:
        return torch.export.load(str(path))
    except Exception as error:
        return error


def raised(result, kind) -> bool:
    """``result`` is an exception of ``kind``, or one raised while handling one."""
    while isinstance(result, BaseException):
        if isinstance(result, kind):
            return True
        result = result.__cause__ or result.__context__
    return False


def copy_entries(source: Path, target: Path, entries=(), replaced=()) -> Path:
    """A copy of the archive ``source`` with its entries as they are, but those named in
    ``replaced``, and ``entries`` ((name or ZipInfo, bytes)) added."""
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w") as copy:
        for info in archive.infolist():
            if info.filename.split("/", 1)[1] not in replaced:
                copy.writestr(info, archive.read(info))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # zipfile: "Duplicate name"
            for entry, data in entries:
                copy.writestr(entry, data)
    return target


def symbolic_link(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


def compressed(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def without_utf8_flag(path: Path, name: str) -> Path:
    """``path`` with the utf-8 flag of member ``name`` cleared in its central directory:
    Python's zip reader then decodes the name as cp437, torch's as utf-8."""
    data = bytearray(path.read_bytes())
    position = data.rindex(name.encode()) - 46  # the central directory's entry: 46 bytes, name
    assert data[position : position + 4] == b"PK\x01\x02"
    flags = struct.unpack_from("<H", data, position + 8)[0]
    struct.pack_into("<H", data, position + 8, flags & ~0x800)
    path.write_bytes(bytes(data))
    return path


EXTRA = "extra/lambda_det_export.json"
MEMBERS = {
    "a ../ member": (
        [("archive/extra/../../evil.txt", b"x")],
        (),
        "its member 'archive/extra/../../evil.txt' is not a relative path under the archive's",
        "loads",
    ),
    "an absolute member": (
        [("/archive/extra/evil.txt", b"x")],
        (),
        "its member '/archive/extra/evil.txt' is an absolute path",
        "raises",
    ),
    "two top-level folders": (
        [("other/extra/evil.txt", b"x")],
        (),
        r"its members are under 2 top-level folders \(archive, other\), not one",
        "raises",
    ),
    "a symbolic link": (
        [(symbolic_link(f"archive/{EXTRA}"), b"/etc/passwd")],
        (EXTRA,),
        f"its member 'archive/{EXTRA}' is a symbolic link",
        "loads",
    ),
    "a folder entry": ([("archive/extra/", b"")], (), "is a folder, not a file", "loads"),
    "a compressed member": (
        [(compressed("archive/extra/notes.txt"), b"0" * 10**7)],
        (),
        r"its member 'archive/extra/notes.txt' is compressed \(torch stores every member",
        "loads",
    ),
    "a member twice": (
        [(f"archive/{EXTRA}", b"{}")],
        (),
        f"its member 'archive/{EXTRA}' is there twice",
        "loads",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", MEMBERS)
def test_members_torch_would_take_or_trip_over_are_refused(case, exported, tmp_path):
    entries, replaced, message, unguarded = MEMBERS[case]
    crafted = copy_entries(exported, tmp_path / "model.pt2", entries, replaced)
    with pytest.raises(ValueError, match=message) as error:
        ExportedModel(crafted)
    assert "\n" not in str(error.value) and str(crafted) in str(error.value)
    result = torch_export_load(crafted)  # the control
    if unguarded == "raises":
        assert isinstance(result, RuntimeError), result  # torch's traceback
    else:
        assert isinstance(result, torch.export.ExportedProgram), result
    if case == "a compressed member":  # torch inflates it: 10 MB from a file of 60 kB
        assert crafted.stat().st_size < 10**5


@pytest.mark.slow
def test_members_the_zip_readers_name_differently_are_refused(exported, tmp_path):
    name = "archive/extra/\u00e9.txt"
    crafted = without_utf8_flag(
        copy_entries(exported, tmp_path / "model.pt2", [(name, b"x")]), name
    )
    with pytest.raises(ValueError, match="torch's zip reader and Python's see other members"):
        ExportedModel(crafted)
    with zipfile.ZipFile(crafted) as archive:  # the control: Python sees another name
        assert name not in archive.namelist()
    assert isinstance(torch_export_load(crafted), torch.export.ExportedProgram)


def deeply_nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def nested_spec(exported: Path) -> bytes:
    """models/model.json with its in_spec (a pytree spec: JSON in a string) nested 100,000 deep."""
    program = json.loads(read_members(exported)["models/model.json"])
    signature = program["graph_module"]["module_call_graph"][0]["signature"]
    signature["in_spec"] = deeply_nested(100_000).decode()
    return json.dumps(program).encode()


FORMATS = {
    "junk version": (
        lambda exported: {"archive_version": b"\xff\xfe0"},
        r"its archive version is b'\\xff\\xfe0', and lambda_det knows the layout of version '0'",
        UnicodeDecodeError,
    ),
    "broken program JSON": (
        lambda exported: {"models/model.json": b'{"graph_module": '},
        r"its models/model.json is not JSON \(Expecting value",
        ValueError,
    ),
    "program JSON nested 100,000 deep": (
        lambda exported: {"models/model.json": deeply_nested(100_000)},
        "its models/model.json is nested deeper than 64 levels",
        RecursionError,
    ),
    "program JSON nested 100 deep": (
        lambda exported: {"models/model.json": deeply_nested(100)},  # json.loads reads it
        "its models/model.json is nested deeper than 64 levels",
        Exception,
    ),
    "config JSON nested 100,000 deep": (
        lambda exported: {"data/weights/model_weights_config.json": deeply_nested(100_000)},
        "its data/weights/model_weights_config.json is nested deeper than 64 levels",
        RecursionError,
    ),
    "pytree spec nested 100,000 deep": (
        lambda exported: {"models/model.json": nested_spec(exported)},
        "its models/model.json's in_spec is nested deeper than 64 levels",
        RecursionError,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", FORMATS)
def test_versions_and_json_torch_cannot_read_are_one_line(case, exported, tmp_path, caplog):
    changes, message, control = FORMATS[case]
    crafted = rewrite(exported, tmp_path / "model.pt2", changes(exported))
    with pytest.raises(ValueError, match=message) as error:
        ExportedModel(crafted)
    assert "\n" not in str(error.value) and str(crafted) in str(error.value)
    # The control: a traceback (torch.export.load logs a RuntimeError's, RecursionError's
    # included, and raises one of its own).
    with caplog.at_level(logging.WARNING, logger="torch.export"):
        result = torch_export_load(crafted)
    logged = [record.exc_info[1] for record in caplog.records if record.exc_info]
    assert any(raised(error, control) for error in [result, *logged]), (result, logged)


@pytest.mark.slow
def test_a_raw_weight_larger_than_its_member_is_refused(exported, tmp_path):
    """torch makes the weight of an empty member with torch.zeros(sizes): here 4 MB from 0
    bytes (the sizes of a 40 GB one cost as little)."""
    config_name = "data/weights/model_weights_config.json"
    config = json.loads(read_members(exported)[config_name])
    name, entry = next(iter(config["config"].items()))
    entry["tensor_meta"]["sizes"] = [{"as_int": 1000}, {"as_int": 1000}]
    entry["tensor_meta"]["strides"] = [{"as_int": 1000}, {"as_int": 1}]
    member = f"data/weights/{entry['path_name']}"
    crafted = rewrite(
        exported, tmp_path / "model.pt2", {config_name: json.dumps(config).encode(), member: b""}
    )
    with pytest.raises(
        ValueError,
        match=f"gives {member} a tensor of .* sizes, more elements than the member's 0 bytes hold",
    ):
        ExportedModel(crafted)
    program = torch_export_load(crafted)  # the control
    assert program.state_dict[name].nbytes == 4 * 10**6


# ---- expressions that take torch hours (or fail in it): refused by their form and bounds ----


def hangs(function, seconds: float = 2.0) -> bool:
    """The negative control of a hang: ``function()`` in a forked child process (pure Python
    work: sympy, integers) is still running after ``seconds``, then killed."""
    child = multiprocessing.get_context("fork").Process(target=function, daemon=True)
    child.start()
    child.join(seconds)
    running = child.is_alive()
    child.kill()
    child.join()
    return running


def run_guard(text: str) -> None:
    """A guard as ExportedProgram.module() runs it on an 8 x 8 image."""
    eval(text, {"L": {"image": torch.zeros(3, 8, 8)}, "math": math, "torch": torch})


SYMBOL = "Symbol('s62', positive=True, integer=True)"


def size_sum(k: int) -> str:
    """A sum of two of 8 sizes with coefficients of both signs: what sympy cannot order."""
    first, second = (
        f"Symbol('s{(k + shift) % 8}', positive=True, integer=True)" for shift in (0, 3)
    )
    return f"Add(Mul(Integer({k + 1}), {first}), Mul(Integer({-k - 2}), {second}), Integer({k}))"


def clamps(count: int, start: int = 0) -> str:
    """Max(Max(...Max(a, b)..., y), z): ``count`` clamps of sums sympy must compare."""
    text = size_sum(start)
    for k in range(start + 1, start + count + 1):
        text = f"Max({text}, {size_sum(k)})"
    return text


CLAMPS = clamps(40)
BOMBS = {
    # sympify (torch's eval of an expr_str) computes each of these for minutes or more.
    "factorial": ("expr_str", "factorial(Integer(10000000))", "hangs"),
    "a huge Pow": ("expr_str", "Pow(Integer(10), Integer(100000000))", "hangs"),
    "a float of huge precision": ("expr_str", "Float('1.5', precision=100000000)", "hangs"),
    "40 nested clamps": ("expr_str", CLAMPS, "hangs"),
    "a huge float": ("expr_str", "Float('1e100000000', precision=53)", "raises"),
    # The guards run on every call of the program.
    "a factorial guard": ("guards_code", "math.factorial(10000000) > 0", "hangs"),
    "a power guard": ("guards_code", "L['image'].size()[1] ** 300000000 > 0", "hangs"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", BOMBS)
def test_expressions_that_would_keep_torch_busy_are_refused_at_once(case, exported, tmp_path):
    where, payload, unguarded = BOMBS[case]
    program = json.loads(read_members(exported)["models/model.json"])
    changes = {}
    if where == "guards_code":
        program["guards_code"] = [payload]
        changes["data/sample_inputs/model.pt"] = sample_inputs()  # so that the guards run
    else:
        text = json.dumps(program)
        assert SYMBOL in text
        program = json.loads(text.replace(json.dumps(SYMBOL), json.dumps(payload), 1))
    changes["models/model.json"] = json.dumps(program).encode()
    crafted = rewrite(exported, tmp_path / "model.pt2", changes)
    start = time.monotonic()
    with pytest.raises(ValueError, match=f"its {where}( entry)? .* (bounds|clamps)") as error:
        ExportedModel(crafted)
    assert time.monotonic() - start < 1
    assert "\n" not in str(error.value) and str(crafted) in str(error.value)
    if unguarded == "hangs":  # the control, in a child killed after 2 s
        work = run_guard if where == "guards_code" else sympy.sympify
        assert hangs(lambda: work(payload))
    else:
        assert isinstance(torch_export_load(crafted), RuntimeError)
    assert not hangs(lambda: sympy.sympify(SYMBOL))  # the control's own control


def sample_inputs() -> bytes:
    buffer = io.BytesIO()
    torch.save(((torch.zeros(3, 8, 8, dtype=torch.uint8),), {}), buffer)
    return buffer.getvalue()


BOUNDS = {
    "characters": (
        "Add(" + ", ".join(["Integer(1)"] * 800) + ")",
        "is 9,603 characters long, more than 8,000",
    ),
    "depth": ("Mul(Integer(2), " * 70 + SYMBOL + ")" * 70, "is nested deeper than 64 levels"),
    "clamps": (clamps(9), r"has more than 8 clamps \(Max, Min\)"),
    "a clamp of three": (
        "Max(Integer(1), Integer(2), Integer(3))",
        "is not an expression of sizes within lambda_det's bounds",
    ),
    # past the parser's depth on Python 3.10-3.12 (refused as no expression), within it on 3.13
    # (then refused by the nesting bound): refused in one line either way
    "a parser overflow": (
        "-" * 5000 + "Integer(1)",
        "(is not an expression of sizes|is nested deeper than 64 levels)",
    ),
}


@pytest.mark.parametrize("case", BOUNDS)
def test_expression_bounds(case):
    text, message = BOUNDS[case]
    with pytest.raises(ValueError, match=f"its expr_str .*{message}") as error:
        _check_expression(text, False, "model.pt2")
    assert "\n" not in str(error.value)


def test_the_size_expressions_evaluate_within_a_time_budget(monkeypatch):
    """Each expression within the bounds is evaluated once; in all they may take
    EVALUATION_SECONDS (here 0.05 s: clamps of sums that sympy must compare take longer)."""
    texts = [clamps(8, start) for start in (100, 200, 300)]  # sympy has cached none of them
    trees = {text: _check_expression(text, False, "model.pt2") for text in texts}
    monkeypatch.setitem(_archive.ARCHIVE_LIMITS, "clamps of two sizes", 24)  # the last bound
    monkeypatch.setattr(_archive, "EVALUATION_SECONDS", 0.05)
    start = time.monotonic()
    with pytest.raises(
        ValueError, match=r"evaluating its 3 size expressions takes more than 0.05 s \(1 done\)"
    ):
        _archive._evaluate_expressions(trees, "model.pt2")
    assert time.monotonic() - start > 0.05  # the control: one of them took longer


def evaluate_all(trees: dict) -> None:
    for tree in trees.values():
        _archive._sympy_value(tree.body)


def test_expressions_that_would_take_seconds_in_all_are_refused_before_evaluating():
    """20 expressions, each within its own bounds (8 clamps of sums sympy must compare): sympy
    takes seconds for them in all; the archive's bounds refuse them at once."""
    texts = [clamps(8, start) for start in range(1000, 3000, 100)]
    trees = {text: _check_expression(text, False, "model.pt2") for text in texts}
    start = time.monotonic()
    with pytest.raises(
        ValueError, match=r"its expr_str values hold 160 clamps \(Max, Min\) of two sizes in all"
    ) as error:
        _archive._evaluate_expressions(trees, "model.pt2")
    assert time.monotonic() - start < 1
    assert "\n" not in str(error.value) and "model.pt2" in str(error.value)
    assert hangs(lambda: evaluate_all(trees))  # the control: evaluated, they take > 2 s


def test_expressions_of_too_many_nodes_in_all_are_refused_before_evaluating():
    sums = [f"Add({SYMBOL}, Integer({k}))" for k in range(10_000)]  # 16 nodes each
    trees = {text: _check_expression(text, False, "model.pt2") for text in sums}
    with pytest.raises(ValueError, match="have 160,000 syntax-tree nodes in all, more than"):
        _archive._evaluate_expressions(trees, "model.pt2")
    _archive._evaluate_expressions(dict(list(trees.items())[:100]), "model.pt2")  # fewer: load


def test_an_expression_that_cannot_be_evaluated_is_one_line():
    text = f"FloorDiv({SYMBOL}, Integer(0))"
    tree = _check_expression(text, False, "model.pt2")
    with pytest.raises(ValueError, match=r"cannot be evaluated \(ZeroDivisionError\)"):
        _archive._evaluate_expressions({text: tree}, "model.pt2")
    with pytest.raises(ZeroDivisionError):  # the control: what torch's sympify raises
        sympy.sympify(text, locals={"FloorDiv": _archive._SYMPY_VALUES["FloorDiv"]})


# ---- TorchScript and ONNX files that torch or onnxruntime cannot load ----


class SystemCall:
    """Unpickling this runs a shell command (os.system, pickled as posix.system)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def torchscript(path: Path, metadata: str = "{}", constants=None) -> Path:
    """A traced TorchScript file with ``metadata`` as lambda_det's extra file; ``constants``:
    what its constants.pkl is replaced with."""
    module = torch.jit.trace(torch.nn.Linear(2, 2), torch.zeros(1, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.save is deprecated
        torch.jit.save(module, str(path), _extra_files={METADATA_NAME: metadata})
    if constants is not None:
        with zipfile.ZipFile(path) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in members.items():
                archive.writestr(name, constants if name.endswith("/constants.pkl") else data)
    return path


def onnx_model(path: Path, keep: float = 1.0) -> Path:
    """An ONNX file of one Identity node, cut to ``keep`` of its bytes."""
    from onnx import TensorProto, helper

    image = helper.make_tensor_value_info("image", TensorProto.UINT8, [3, None, None])
    output = helper.make_tensor_value_info("output", TensorProto.UINT8, [3, None, None])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["image"], ["output"])], "g", [image], [output]
    )
    # IR version 8 (opset 17's): onnx's default is its newest, which an older onnxruntime (the
    # newest on Python 3.10) refuses to load
    opset = [helper.make_opsetid("", 17)]
    data = helper.make_model(graph, opset_imports=opset, ir_version=8).SerializeToString()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def random_bytes(path: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    path.write_bytes(torch.randint(0, 256, (2000,), dtype=torch.uint8, generator=generator).numpy())
    return path


GOOD_METADATA = json.dumps(
    {"input_shape": [3, None, None], "input_dtype": "uint8", "output_names": ["output"]}
)
FILES = {
    "random bytes named .onnx": (
        lambda folder, marker: random_bytes(folder / "model.onnx"),
        "is not an ONNX model onnxruntime can load",
    ),
    "a truncated .onnx": (
        lambda folder, marker: onnx_model(folder / "model.onnx", keep=0.6),
        "is not an ONNX model onnxruntime can load",
    ),
    "TorchScript constants naming posix.system": (
        lambda folder, marker: torchscript(
            folder / "model.ts", GOOD_METADATA, pickle.dumps(SystemCall(marker), protocol=2)
        ),
        r"cannot be loaded as TorchScript \(Unknown type name 'posix.system'",
    ),
    "TorchScript metadata that is not JSON": (
        lambda folder, marker: torchscript(folder / "model.ts", '{"input_shape": '),
        f"is not a TorchScript file written by lambda_det.export \\(its {METADATA_NAME} is not "
        "JSON of its input and outputs\\)",
    ),
    "TorchScript metadata of other values": (
        lambda folder, marker: torchscript(
            folder / "model.ts", json.dumps({**json.loads(GOOD_METADATA), "input_dtype": "load"})
        ),
        f"its {METADATA_NAME} is not JSON of its input and outputs",
    ),
}


@pytest.mark.parametrize("case", FILES)
def test_exported_files_torch_or_onnxruntime_cannot_load_are_one_line(case, tmp_path):
    write, message = FILES[case]
    marker = tmp_path / "code_ran"
    path = write(tmp_path, marker)
    with pytest.raises(ValueError, match=message) as error:
        ExportedModel(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)
    assert not marker.exists()
    # The control: the library's own error, a traceback.
    if path.suffix == ".onnx":
        import onnxruntime

        with pytest.raises(Exception) as unguarded:
            onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert not isinstance(unguarded.value, ValueError)
    elif "posix" in case:
        with pytest.raises(RuntimeError):
            torch.jit.load(str(path))
    else:  # the metadata's plain reading: an error, or a function taken for a dtype
        extra_files = {METADATA_NAME: ""}
        torch.jit.load(str(path), _extra_files=extra_files)
        if "other values" in case:
            dtype = json.loads(extra_files[METADATA_NAME])["input_dtype"]
            assert callable(getattr(torch, dtype)) and not isinstance(
                getattr(torch, dtype), torch.dtype
            )
        else:
            with pytest.raises(json.JSONDecodeError):
                json.loads(extra_files[METADATA_NAME])


def test_exported_files_that_load_and_a_sidecar_that_is_not_json(tmp_path):
    """A TorchScript file with lambda_det's metadata and an ONNX file load; a metadata file
    beside one that is not a JSON object is one line naming it."""
    script = ExportedModel(torchscript(tmp_path / "model.ts", GOOD_METADATA))
    assert script.input_shape == (3, None, None) and script.output_names == ("output",)
    onnx_file = onnx_model(tmp_path / "model.onnx")
    image = torch.randint(0, 256, (3, 4, 5), dtype=torch.uint8)
    assert torch.equal(ExportedModel(onnx_file)(image)["output"], image)
    metadata_path(onnx_file).write_text("[1, 2")
    with pytest.raises(
        ValueError, match=r"model.onnx.json', the metadata of .*, is not a JSON object"
    ):
        ExportedModel(onnx_file)
