"""Importing lambda_det's core needs torch alone: no detectron2, so it works in any PyTorch
project."""

import configparser
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, run_python, subprocess_env

# Makes detectron2 unimportable in the child, as in an environment that has only torch.
BLOCK_DETECTRON2 = """
import importlib.abc
import sys

import pytest


class BlockDetectron2(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "detectron2":
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


sys.meta_path.insert(0, BlockDetectron2())
try:
    import detectron2  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    raise AssertionError("detectron2 is still importable")
"""

# The benchmark of whole detectors (tools/benchmark_detector.py) trains detectron2 models; the
# two commands on lambda_det.cli's arguments import lambda_det's detectron2 parts. benchmarks/ is
# the checkout's (not installed): the child runs in the checkout.
IMPORT_THE_CORE = """
DETECTRON2_PARTS = ("benchmarks.detector", "benchmarks.detector_step", "benchmarks.lambda_layer")
import importlib
import pkgutil

import torch

import benchmarks
import lambda_det
import lambda_det.layers

names = []
for package in (lambda_det.layers, benchmarks):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if module.name in DETECTRON2_PARTS:
            continue
        importlib.import_module(module.name)
        names.append(module.name)
layer = lambda_det.layers.LambdaLayer(8, heads=2, dim_k=4, scope=3)
assert layer(torch.randn(1, 8, 5, 5)).shape == (1, 8, 5, 5)
assert lambda_det.__version__
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "detectron2")
assert not loaded, loaded
print(" ".join(names))
"""


@pytest.mark.slow
def test_layers_and_benchmark_import_and_run_without_detectron2():
    result = run_python("-c", BLOCK_DETECTRON2 + IMPORT_THE_CORE)
    assert result.returncode == 0, result.stderr
    imported = set(result.stdout.split())
    assert {
        "lambda_det.layers.lambda_layer",
        "lambda_det.layers.lambda_conv",
        "lambda_det.layers.aft",
        "lambda_det.layers.position_embedding",
        "benchmarks.harness",
        "benchmarks.candidates",
        "benchmarks.modes",
        "benchmarks.count_kernels",
    } <= imported


# The LambdaResNet, lambda_det's lazy names and the timm models, as a timm user runs them.
USE_THE_MODEL = """
import torch
import timm

import lambda_det
import lambda_det.modeling.timm_models

model = lambda_det.lambda_resnet(26, width_multiplier=0.25, scope=3, freeze_at=2).eval()
assert isinstance(model, lambda_det.LambdaResNet) and lambda_det.LambdaLayer
assert model(torch.randn(1, 3, 64, 64))["res5"].shape == (1, 512, 2, 2)
classifier = timm.create_model("lambda_resnet26_det", num_classes=3, width_multiplier=0.25)
assert classifier(torch.randn(2, 3, 64, 64)).shape == (2, 3)
try:
    lambda_det.LambdaResNetBackbone
except ImportError as error:
    assert str(error).startswith("lambda_det needs detectron2"), error
else:
    raise AssertionError("lambda_det.LambdaResNetBackbone without detectron2")
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "detectron2")
assert not loaded, loaded
print("ok")
"""


@pytest.mark.slow
def test_the_model_and_the_timm_models_run_without_detectron2():
    pytest.importorskip("timm")
    result = run_python("-c", BLOCK_DETECTRON2 + USE_THE_MODEL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok"]


@pytest.mark.slow  # child processes
def test_detectron2_parts_say_what_is_missing():
    code = (
        BLOCK_DETECTRON2
        + """
import lambda_det
try:
    lambda_det.get_cfg
except ImportError as error:
    assert ".venv/bin/python tools/" in str(error) and "bin/activate" in str(error), error
else:
    raise AssertionError("lambda_det.get_cfg without detectron2")
"""
    )
    result = run_python("-c", code)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_import_lambda_det_registers_the_backbones():
    """As a detectron2 plug-in is used: ``import lambda_det``, then detectron2's ``build_model``."""
    code = """
import lambda_det
from detectron2.config import get_cfg
from detectron2.modeling import build_model

cfg = lambda_det.add_lambda_resnet_config(lambda_det.add_lambda_det_config(get_cfg()))
cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.BACKBONE.NAME", "build_lambda_resnet_backbone",
                     "MODEL.LAMBDA_RESNET.DEPTH", "26", "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER",
                     "0.25", "MODEL.RESNETS.RES2_OUT_CHANNELS", "64"])
print(type(build_model(cfg).backbone).__name__)
"""
    result = run_python("-c", code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["LambdaResNetBackbone"]


def test_the_missing_detectron2_message_names_the_checkouts_venv(tmp_path):
    from lambda_det.compat import missing_detectron2_message

    without = missing_detectron2_message(tmp_path)  # negative control: no .venv/ yet
    assert "make venv" in without and "tools/build_detectron2.py" in without
    (tmp_path / ".venv/bin").mkdir(parents=True)
    (tmp_path / ".venv/bin/python").touch()
    with_venv = missing_detectron2_message(tmp_path)
    assert f"{tmp_path}/.venv/bin/python tools/..." in with_venv
    assert f"source {tmp_path}/.venv/bin/activate" in with_venv
    assert sys.executable in with_venv


def _lint_imports(config: str) -> subprocess.CompletedProcess:
    lint_imports = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    return subprocess.run(
        [lint_imports, "--config", config, "--no-cache"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=REPO_ROOT,
        timeout=300,
    )


def test_packages_import_only_the_packages_below_them():
    result = _lint_imports(str(REPO_ROOT / ".importlinter"))
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = (REPO_ROOT / ".importlinter").read_text().count("[importlinter:contract:")
    assert f"{contracts} kept, 0 broken" in result.stdout, result.stdout


def _layers_contracts() -> dict:
    """The layers of each `layers` contract of .importlinter: {name: [[package, ...], ...]}."""
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / ".importlinter")
    return {
        section: [
            line.replace(" ", "").split("|")
            for line in config[section]["layers"].splitlines()
            if line.strip()
        ]
        for section in config.sections()
        if config[section].get("type") == "layers"
    }


def _unbacked_order(graph, layers: list) -> list:
    """What ``layers`` claims without an import chain behind it: a package above another that it
    does not import (directly or not), and packages side by side of which one imports the other."""
    problems = []
    for index, layer in enumerate(layers):
        for upper in layer:
            for lower in [package for below in layers[index + 1 :] for package in below]:
                if not graph.chain_exists(importer=upper, imported=lower, as_packages=True):
                    problems.append(f"{upper} above {lower}, which it does not import")
            for other in layer:
                if other != upper and graph.chain_exists(upper, other, as_packages=True):
                    problems.append(f"{upper} beside {other}, which it imports")
    return problems


def test_the_layers_contracts_order_exactly_the_imports_between_packages():
    """Each contract orders only packages that import one another, and every import of one of
    lambda_det's packages by another is ordered by a contract (an import back breaks it)."""
    grimp = pytest.importorskip("grimp")  # import-linter's graph of the imports
    graph = grimp.build_graph("lambda_det", include_external_packages=False, cache_dir=None)
    contracts = _layers_contracts()
    for name, layers in contracts.items():
        assert _unbacked_order(graph, layers) == [], name
    # Negative control: two packages of which neither imports the other.
    problems = _unbacked_order(graph, [["lambda_det.reports"], ["lambda_det.config"]])
    assert problems == ["lambda_det.reports above lambda_det.config, which it does not import"]
    ordered = {
        (upper, lower)
        for layers in contracts.values()
        for index, layer in enumerate(layers)
        for upper in layer
        for below in layers[index + 1 :]
        for lower in below
    }
    packages = sorted(graph.find_children("lambda_det"))
    imports = {
        (importer, imported)
        for importer in packages
        for imported in packages
        if importer != imported
        and graph.direct_import_exists(importer=importer, imported=imported, as_packages=True)
    }
    assert len(imports) > 40 and imports <= ordered, sorted(imports - ordered)


def test_the_model_contract_catches_a_detectron2_import(tmp_path):
    # The contract of the torch-only model modules, pointed at the builders: they import it.
    contract = (REPO_ROOT / ".importlinter").read_text()
    model = contract[contract.index("[importlinter:contract:model-without-detectron2]") :]
    model = model.split("\n\n[")[0]
    sources = model.split("source_modules =\n")[1].split("forbidden_modules")[0]
    broken = model.replace(sources, "    lambda_det.modeling.build\n")
    header = contract[: contract.index("[importlinter:contract:")]
    (tmp_path / "contract.ini").write_text(header + broken + "\n")
    result = _lint_imports(str(tmp_path / "contract.ini"))
    assert result.returncode != 0 and "BROKEN" in result.stdout, result.stdout


def test_the_import_contract_catches_an_upward_import(tmp_path):
    # The same packages in the opposite order: the package's real imports must break it.
    contract = (REPO_ROOT / ".importlinter").read_text()
    packages = contract.split("layers =\n")[1].split("\n\n")[0].splitlines()
    upside_down = contract.replace("\n".join(packages), "\n".join(reversed(packages)))
    (tmp_path / "contract.ini").write_text(upside_down)
    result = _lint_imports(str(tmp_path / "contract.ini"))
    assert result.returncode != 0 and "BROKEN" in result.stdout, result.stdout


def _lint_a_copy_with(tmp_path, module: str, code: str) -> subprocess.CompletedProcess:
    """lint-imports on a copy of the checked packages whose ``module`` (a path) ends in ``code``."""
    for package in ("lambda_det", "benchmarks"):
        shutil.copytree(
            REPO_ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    changed = tmp_path / module
    changed.write_text(changed.read_text() + code)
    contract = (REPO_ROOT / ".importlinter").read_text()
    (tmp_path / ".importlinter").write_text(contract)
    lint_imports = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    env = {**subprocess_env(), "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [lint_imports, "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def test_the_import_contract_catches_config_importing_the_data(tmp_path):
    # A copy of the package whose config imports the data stack, as its loader once did to
    # register datasets: the forbidden contract must break, naming the import.
    result = _lint_a_copy_with(
        tmp_path,
        "lambda_det/config/config.py",
        "\n\ndef _register(cfg):\n"
        "    from lambda_det.data.coco import register_coco_datasets\n\n"
        "    register_coco_datasets(cfg)\n",
    )
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts")[-1]
    assert "The config imports neither the model nor the data" in broken, result.stdout
    assert "lambda_det.config.config -> lambda_det.data.coco" in broken, result.stdout


@pytest.mark.parametrize(
    "module, code, contract, import_",
    [
        (
            "lambda_det/cli/arguments.py",
            "\nimport benchmarks.harness  # noqa\n",
            "The installed package never imports the checkout's benchmarks",
            "lambda_det.cli.arguments -> benchmarks.harness",
        ),
        (
            "benchmarks/report.py",
            "\nimport detectron2.config  # noqa\n",
            "The lambda layer and the layer benchmarks need torch alone",
            "benchmarks.report -> detectron2 ",
        ),
    ],
    ids=["lambda_det imports benchmarks", "a torch-only benchmark imports detectron2"],
)
def test_the_import_contracts_check_the_benchmarks(tmp_path, module, code, contract, import_):
    # benchmarks/ is a root of its own: an import into it from the installed package, or of
    # detectron2 from its torch-only modules, breaks a contract.
    result = _lint_a_copy_with(tmp_path, module, code)
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts")[-1]
    assert contract in " ".join(broken.split()), result.stdout
    assert import_ in broken, result.stdout


@pytest.mark.slow  # child processes
def test_the_timm_converter_needs_no_timm():
    """tools/convert_timm_checkpoint.py turns a state dict into detector weights by names and
    shapes: it runs where timm is not installed (the detector's machine), while the timm models
    themselves need timm (the negative control of the block)."""
    code = """
import sys

sys.modules["timm"] = None  # `import timm` raises ImportError
from lambda_det.checkpoint.timm_classifier import convert_classifier_checkpoint  # noqa: F401
from lambda_det.cli import convert_timm_checkpoint  # noqa: F401

try:
    import lambda_det.modeling.timm_models  # noqa: F401
except ImportError:
    print("ok")
"""
    result = run_python("-c", code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok"]
