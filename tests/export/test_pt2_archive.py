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
import pickle
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import Payload
from detectron2.structures import Boxes, Instances

from lambda_det.export import ExportedModel, eager_outputs, export_model
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
