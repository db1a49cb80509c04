"""``python -m lambda_det.d2tool``: no file given to one of detectron2's scripts runs code. Its
checkpointers read weights through lambda_det's safe loader, ``LazyConfig.load`` reads a yaml
with the safe loader; what detectron2 loads still loads, bit for bit; a refused or missing file
is one ``error:`` line with exit status 2."""

import ast
import contextlib
import copy
import json
import pickle
import runpy
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    DEMO_CONFIG,
    REPO_ROOT,
    _shapes_registered_from,
    overrides,
    tiny_model,
    write_payload,
)
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import LazyConfig
from fvcore.common.checkpoint import Checkpointer
from torch import nn

from lambda_det.checkpoint import CorruptCheckpointError, UnsafeCheckpointError
from lambda_det.cli.d2tool import (
    ScriptFiles,
    _installed_tools,
    detectron2_tool_path,
    lambda_det_in_detectron2,
    main,
)

# The demo config at a quarter width, on the CPU (its test set stays: analyze_model reads it).
TINY = overrides(
    {
        "MODEL.DEVICE": "cpu",
        "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER": "0.25",
        "MODEL.LAMBDA_RESNET.SCOPE": "3",
    }
)
LAZY_DEMO = str(REPO_ROOT / "configs/LazyConfigs/Demo/lambda_r26_shapes.py")
# torch >= 2.6 loads with weights_only=True by default; this restores the unsafe default, so
# that a .pth payload fires in detectron2's own loader (fvcore's torch.load(f)).
UNSAFE_TORCH_DEFAULT = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


@pytest.fixture(scope="module")
def model(one_torch_thread):
    return tiny_model()


def script_or_skip(name: str) -> str:
    try:
        return detectron2_tool_path(name)
    except FileNotFoundError as error:
        pytest.skip(f"this detectron2 installs no tools/ scripts ({error})")


def one_error_line(capsys, exit_status, *fragments: str) -> str:
    assert exit_status.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and err[-1].startswith("error: "), err[-5:]
    assert "Traceback" not in "\n".join(err)
    for fragment in fragments:
        assert fragment in err[-1]
    return err[-1]


# ---- the checkpointers, patched ----


@pytest.mark.filterwarnings(f"ignore:Environment variable {UNSAFE_TORCH_DEFAULT}")
@pytest.mark.parametrize(
    "checkpointer, kind",
    [
        (DetectionCheckpointer, "pkl"),
        (DetectionCheckpointer, "pth"),
        (DetectionCheckpointer, "pth-legacy"),
        (Checkpointer, "pth"),
        (Checkpointer, "pth-legacy"),
    ],
)
def test_a_payload_fires_in_detectron2s_checkpointer_and_is_refused_in_d2tools(
    checkpointer, kind, tmp_path, monkeypatch
):
    monkeypatch.setenv(UNSAFE_TORCH_DEFAULT, "1")
    marker = tmp_path / "marker"
    payload = write_payload(tmp_path / f"evil.{kind.split('-')[0]}", kind, marker)
    # load, not _load_file: detectron2 after 0.6 asserts that _load_file runs inside load.
    checkpointer(nn.Module()).load(str(payload))
    assert marker.exists()  # the payload fires without the guard
    marker.unlink()
    with lambda_det_in_detectron2(), pytest.raises(UnsafeCheckpointError, match=str(payload)):
        checkpointer(nn.Module()).load(str(payload))
    assert not marker.exists()


def zeroed(model: nn.Module) -> nn.Module:
    target = copy.deepcopy(model)
    with torch.no_grad():
        for value in target.state_dict().values():
            value.zero_()
    return target


def write_weights(path, layout: str, model: nn.Module):
    weights = {key: value.numpy() for key, value in model.state_dict().items()}
    if layout == "model zoo .pkl":  # as detectron2's model zoo stores them
        path.write_bytes(
            pickle.dumps({"model": weights, "__author__": "Detectron2 Model Zoo"}, protocol=2)
        )
    elif layout == "caffe2 .pkl":  # read with detectron2's name matching
        path.write_bytes(pickle.dumps({"blobs": weights}, protocol=2))
    else:
        torch.save({"model": model.state_dict(), "iteration": 5}, path)
    return str(path)


@pytest.mark.parametrize("layout", ["model zoo .pkl", "caffe2 .pkl", "torch .pth"])
def test_what_detectron2_loads_loads_the_same_through_d2tool(layout, model, tmp_path):
    path = write_weights(tmp_path / ("w.pth" if "pth" in layout else "w.pkl"), layout, model)
    theirs, ours = zeroed(model), zeroed(model)
    their_extra = DetectionCheckpointer(theirs).load(path)
    with lambda_det_in_detectron2():
        our_extra = DetectionCheckpointer(ours).load(path)
    assert our_extra.keys() == their_extra.keys()
    for (key, their_value), our_value in zip(
        theirs.state_dict().items(), ours.state_dict().values()
    ):
        assert torch.equal(their_value, our_value), key
    if layout != "caffe2 .pkl":  # (name matching renames detectron2's own names)
        for key, value in model.state_dict().items():
            assert torch.equal(ours.state_dict()[key], value), key


def test_a_missing_checkpoint_is_named(tmp_path):
    with (
        lambda_det_in_detectron2(),
        pytest.raises(FileNotFoundError, match=f"checkpoint '{tmp_path}/none.pth' does not"),
    ):
        DetectionCheckpointer(nn.Module()).load(str(tmp_path / "none.pth"))
    with pytest.raises(AssertionError):  # detectron2's own
        DetectionCheckpointer(nn.Module()).load(str(tmp_path / "none.pth"))


# ---- the doors: detectron2's scripts given a payload ----


def fire_unguarded(payload) -> None:
    """The negative control: detectron2's own checkpointer runs the payload."""
    DetectionCheckpointer(nn.Module())._load_file(str(payload))


def loaded_unguarded(self, checkpoint):
    raise AssertionError("the checkpoint was read without the guard")


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize(
    "script", ["train_net.py", "analyze_model.py", "benchmark.py", "lazyconfig_train_net.py"]
)
def test_a_payload_given_to_a_detectron2_script_is_one_error_line(
    script, tmp_path, capsys, monkeypatch, shapes, one_torch_thread
):
    script_or_skip(script)
    if script == "benchmark.py":
        pytest.importorskip("psutil", reason="detectron2's benchmark.py imports psutil")
    marker = tmp_path / "marker"
    payload = write_payload(tmp_path / "evil.pkl", "pkl", marker)
    fire_unguarded(payload)
    assert marker.exists()
    marker.unlink()
    yaml_config = ["--config-file", DEMO_CONFIG, *TINY, "MODEL.WEIGHTS", str(payload)]
    argv = {
        "train_net.py": ["--eval-only", *yaml_config, "OUTPUT_DIR", str(tmp_path / "out")],
        "analyze_model.py": ["--tasks", "flop", *yaml_config],
        "benchmark.py": ["--task", "eval", *yaml_config],
        "lazyconfig_train_net.py": [
            "--eval-only",
            "--config-file",
            LAZY_DEMO,
            f"train.init_checkpoint={payload}",
            f"train.output_dir={tmp_path / 'out'}",
            "model.backbone.bottom_up.norm=BN",
        ],
    }[script]
    # Without the guard the file would load and the script go on with its work: stop it there.
    monkeypatch.setattr(DetectionCheckpointer, "_load_model", loaded_unguarded)
    with pytest.raises(SystemExit) as exit_status:
        main([script, *argv])
    one_error_line(capsys, exit_status, f"checkpoint {payload} refers to", "refused")
    assert not marker.exists()


def test_a_lazyconfig_yaml_is_read_without_its_tags(tmp_path, capsys):
    script_or_skip("lazyconfig_train_net.py")
    marker = tmp_path / "marker"
    config = tmp_path / "evil.yaml"
    code = f"open({str(marker)!r}, 'w').close()"
    config.write_text(f"train: !!python/object/apply:builtins.exec [{json.dumps(code)}]\n")
    LazyConfig.load(str(config))  # detectron2's own: yaml.unsafe_load
    assert marker.exists()
    marker.unlink()
    with pytest.raises(SystemExit) as exit_status:
        main(["lazyconfig_train_net.py", "--config-file", str(config), "--eval-only"])
    one_error_line(
        capsys,
        exit_status,
        f"LazyConfig {config}, line 1: the yaml tag !!python/object/apply:builtins.exec names "
        f"builtins.exec, which a LazyConfig yaml may not name",
    )
    assert not marker.exists()


def test_a_plain_lazyconfig_yaml_loads_as_detectron2_loads_it(tmp_path):
    config = tmp_path / "saved.yaml"
    config.write_text("train: {max_iter: 5, device: cpu}\nmodel: {_target_: torch.nn.Identity}\n")
    with lambda_det_in_detectron2():
        ours = LazyConfig.load(str(config))
        (our_train,) = LazyConfig.load(str(config), keys=("train",))
        recipe = LazyConfig.load(LAZY_DEMO)  # a .py recipe: detectron2's own loading
    assert ours == LazyConfig.load(str(config))
    assert (
        our_train == LazyConfig.load(str(config), keys="train") == {"max_iter": 5, "device": "cpu"}
    )
    assert recipe.train.max_iter == 600
    assert LazyConfig.load.__module__.startswith("detectron2")  # only within


# ---- errors: one line for the input's, a traceback for the script's own ----


def test_a_yaml_tag_or_a_missing_config_is_one_error_line(tmp_path, capsys):
    script_or_skip("train_net.py")
    marker = tmp_path / "marker"
    config = tmp_path / "evil.yaml"
    config.write_text(f'SEED: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(SystemExit) as exit_status:
        main(["train_net.py", "--eval-only", "--config-file", str(config)])
    one_error_line(
        capsys,
        exit_status,
        f"config file {config}, line 1: the yaml tag !!python/object/apply:os.system is refused",
    )
    assert not marker.exists()
    with pytest.raises(SystemExit) as exit_status:
        main(
            [
                "analyze_model.py",
                "--tasks",
                "parameter",
                "--config-file",
                str(tmp_path / "none.yaml"),
            ]
        )
    one_error_line(capsys, exit_status, f"config file {tmp_path / 'none.yaml'} does not exist")
    with pytest.raises(FileNotFoundError):  # --debug: the traceback
        main(
            [
                "--debug",
                "analyze_model.py",
                "--tasks",
                "parameter",
                "--config-file",
                str(tmp_path / "none.yaml"),
            ]
        )


@pytest.mark.slow
@pytest.mark.e2e
def test_missing_weights_are_one_error_line(tmp_path, capsys, one_torch_thread):
    script_or_skip("train_net.py")
    missing = tmp_path / "none.pth"
    with pytest.raises(SystemExit) as exit_status:
        main(
            [
                "train_net.py",
                "--eval-only",
                "--config-file",
                DEMO_CONFIG,
                *TINY,
                "MODEL.WEIGHTS",
                str(missing),
                "OUTPUT_DIR",
                str(tmp_path / "out"),
            ]
        )
    one_error_line(capsys, exit_status, f"checkpoint '{missing}' does not exist")


@pytest.mark.parametrize("error", [FileExistsError, FileNotFoundError, KeyError])
def test_a_scripts_own_error_keeps_its_traceback(error, tmp_path):
    script = tmp_path / "buggy.py"
    script.write_text(f"raise {error.__name__}('a bug of the script')\n")
    with pytest.raises(error, match="a bug of the script"):
        main([str(script)])


def test_a_missing_lazyconfig_is_one_error_line(tmp_path, capsys):
    script_or_skip("lazyconfig_train_net.py")
    for missing in (tmp_path / "none.py", tmp_path / "none.yaml"):
        with pytest.raises(SystemExit) as exit_status:
            main(["lazyconfig_train_net.py", "--config-file", str(missing), "--eval-only"])
        one_error_line(capsys, exit_status, f"LazyConfig '{missing}' does not exist")


def test_a_pkl_of_another_layout_is_one_line_naming_it(tmp_path):
    """{"model": weights} without "__author__": detectron2 reads it as Caffe2's layout and fvcore
    fails with "Unsupported type"; d2tool's error names the file and the layouts that load."""
    weights = {"conv.weight": np.zeros((2, 2), np.float32)}
    path = tmp_path / "no_author.pkl"
    path.write_bytes(pickle.dumps({"model": weights}, protocol=2))
    with pytest.raises(ValueError, match="Unsupported type"):  # detectron2's own
        DetectionCheckpointer(nn.Module()).load(str(path))
    with (
        lambda_det_in_detectron2(),
        pytest.raises(
            CorruptCheckpointError,
            match=f"checkpoint {path}: 'model' is of type dict, not a "
            f"numpy array \\(without '__author__' .* add",
        ),
    ):
        DetectionCheckpointer(nn.Module()).load(str(path))


# ---- a LazyConfig yaml is data; --trust-config FILE makes one file code ----


def test_a_lazyconfig_yaml_that_names_code_is_refused_unless_trusted(tmp_path, capsys):
    script_or_skip("lazyconfig_train_net.py")
    marker = tmp_path / "marker"
    config = tmp_path / "recipe.yaml"
    config.write_text(
        f"model: {{_target_: os.system, command: 'touch {marker}'}}\n"
        f"train: {{output_dir: {tmp_path / 'out'}, init_checkpoint: '', device: cpu}}\n"
    )
    other = tmp_path / "other.yaml"  # trust is given to a file, not to any yaml
    other.write_text(config.read_text())
    argv = ["lazyconfig_train_net.py", "--config-file", str(config), "--eval-only"]
    for options in ([], ["--trust-config", str(other)]):
        with pytest.raises(SystemExit) as exit_status:
            main([*options, *argv])
        one_error_line(
            capsys,
            exit_status,
            f"LazyConfig {config}: model._target_ names 'os.system', which a LazyConfig yaml "
            f"may not name",
            f"pass --trust-config {config} to python -m lambda_det.d2tool before SCRIPT",
        )
        assert not marker.exists()
    # Trusted, it loads as detectron2 loads it: os.system runs (and the script then fails on
    # the number it returned, with the script's own traceback).
    with pytest.raises(AttributeError):
        main([f"--trust-config={config}", *argv])
    assert marker.exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--trust", "train_net.py"], "--trust is no option of d2tool (--debug, --overwrite,"),
        (["--trust-config", "none.yaml", "x.py"], "--trust-config 'none.yaml' is no file"),
        (["--trust-config"], "--trust-config '' is no file"),
    ],
)
def test_a_wrong_d2tool_option_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_status:
        main(argv)
    one_error_line(capsys, exit_status, message)


SCRIPT_OPTIONS = {"benchmark.py": ["--task", "eval"], "train_net.py": ["--eval-only"]}


@pytest.mark.parametrize("script", ["benchmark.py", "train_net.py"])
def test_a_lazyconfig_yaml_where_a_yacs_config_is_read_is_one_line(script, tmp_path, capsys):
    """benchmark.py reads a --config-file ending in .yaml with get_cfg(): a saved LazyConfig
    there is a KeyError in detectron2 ("Non-existent config key: train")."""
    from detectron2.config import get_cfg

    script_or_skip(script)
    if script == "benchmark.py":
        pytest.importorskip("psutil", reason="detectron2's benchmark.py imports psutil")
    saved = tmp_path / "recipe.yaml"
    LazyConfig.save(LazyConfig.load(LAZY_DEMO), str(saved))
    with pytest.raises(KeyError):  # detectron2's own
        get_cfg().merge_from_file(str(saved))
    with pytest.raises(SystemExit) as exit_status:
        main([script, "--config-file", str(saved), *SCRIPT_OPTIONS[script]])
    instead = (
        "pass its .py recipe" if script == "benchmark.py" else "pass a yacs config (a LazyConfig"
    )
    one_error_line(
        capsys,
        exit_status,
        f"config file {saved} is a LazyConfig (its keys model, dataloader, optimizer, "
        f"lr_multiplier, train are a LazyConfig's sections), not a yacs config",
        f"{script} reads a .yaml --config-file as a yacs config; {instead}",
    )


# ---- the files detectron2's scripts read and write themselves ----


def test_the_scripts_that_load_a_file_themselves_are_those_d2tool_routes():
    """A script of the installed detectron2 that calls torch.load or pickle.load itself (not
    through a checkpointer) reads its file outside lambda_det's loader unless d2tool routes
    it: torch.load is routed (convert-torchvision-to-d2.py); pickle's are not."""
    loads = {}
    for name, path in sorted(_installed_tools().items()):
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("load", "loads")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("torch", "pickle", "pkl", "cPickle")
            ):
                loads.setdefault(name, set()).add(f"{node.func.value.id}.{node.func.attr}")
    if not _installed_tools():
        pytest.skip("this detectron2 installs no tools/ scripts")
    assert loads == {"convert-torchvision-to-d2.py": {"torch.load"}}


@pytest.mark.filterwarnings(f"ignore:Environment variable {UNSAFE_TORCH_DEFAULT}")
def test_torch_load_reads_through_lambda_dets_loader_within(tmp_path, monkeypatch, model):
    monkeypatch.setenv(UNSAFE_TORCH_DEFAULT, "1")
    marker = tmp_path / "marker"
    payload = write_payload(tmp_path / "evil.pth", "pth", marker)
    torch.load(payload)  # torch's own, under the variable: the payload fires
    assert marker.exists()
    marker.unlink()
    weights = tmp_path / "weights.pth"
    torch.save(model.state_dict(), weights)
    torchs_own = torch.load
    with lambda_det_in_detectron2():
        assert torch.load is not torchs_own
        for call in (
            lambda: torch.load(str(payload), map_location="cpu"),
            lambda: torch.load(payload, weights_only=False),
        ):
            with pytest.raises(UnsafeCheckpointError, match=f"checkpoint {payload} refers to"):
                call()
        with open(payload, "rb") as f, pytest.raises(pickle.UnpicklingError):
            torch.load(f)  # an open file: torch's load with weights_only=True
        loaded = torch.load(str(weights), map_location="cpu")
    assert not marker.exists()
    assert loaded.keys() == model.state_dict().keys()
    assert all(torch.equal(loaded[key], value) for key, value in model.state_dict().items())
    assert torch.load is torchs_own
    with contextlib.suppress(RuntimeError), lambda_det_in_detectron2():
        raise RuntimeError("a script's error")
    assert torch.load is torchs_own  # restored on an exception too


def torchvision_weights(path: Path) -> Path:
    """A file as torchvision's ResNets are saved: a state dict of their names."""
    torch.save(
        {"conv1.weight": torch.randn(4, 3, 7, 7), "layer1.0.bn1.weight": torch.randn(4)}, path
    )
    return path


def run_unguarded(script: str, *args: str, monkeypatch) -> None:
    """The negative control: detectron2's script run as it is, without d2tool."""
    monkeypatch.setattr(sys, "argv", [script, *args])
    runpy.run_path(script, run_name="__main__")


@pytest.mark.filterwarnings(f"ignore:Environment variable {UNSAFE_TORCH_DEFAULT}")
def test_convert_torchvision_to_d2_refuses_a_payload_or_missing_file_in_one_line(
    tmp_path, capsys, monkeypatch
):
    script = script_or_skip("convert-torchvision-to-d2.py")
    monkeypatch.setenv(UNSAFE_TORCH_DEFAULT, "1")
    marker = tmp_path / "marker"
    payload = write_payload(tmp_path / "evil.pth", "pth", marker)
    with contextlib.suppress(Exception):
        run_unguarded(script, str(payload), str(tmp_path / "theirs.pkl"), monkeypatch=monkeypatch)
    assert marker.exists()  # detectron2's script, under the variable, runs the payload
    marker.unlink()
    output = tmp_path / "out.pkl"
    for weights, fragment in [
        (payload, f"checkpoint {payload} refers to exec, which runs code"),
        (tmp_path / "none.pth", f"weights file '{tmp_path / 'none.pth'}' does not exist"),
    ]:
        with pytest.raises(SystemExit) as exit_status:
            main(["convert-torchvision-to-d2.py", str(weights), str(output)])
        one_error_line(capsys, exit_status, fragment)
    assert not marker.exists()
    assert not output.exists() and not list(tmp_path.glob(".d2tool-*"))


def test_convert_torchvision_to_d2_writes_over_no_file_it_did_not_create(
    tmp_path, capsys, monkeypatch
):
    script = script_or_skip("convert-torchvision-to-d2.py")
    weights = torchvision_weights(tmp_path / "r.pth")
    original = weights.read_bytes()
    copy_of_weights = tmp_path / "copy.pth"
    copy_of_weights.write_bytes(original)
    run_unguarded(script, str(copy_of_weights), str(copy_of_weights), monkeypatch=monkeypatch)
    assert copy_of_weights.read_bytes() != original  # detectron2's script replaces its input
    (tmp_path / "link.pth").symlink_to(weights)
    for output in (weights, tmp_path / "link.pth"):
        for options in ([], ["--overwrite"]):
            with pytest.raises(SystemExit) as exit_status:
                main([*options, "convert-torchvision-to-d2.py", str(weights), str(output)])
            one_error_line(
                capsys,
                exit_status,
                f"convert-torchvision-to-d2.py's output '{output}' is its input '{weights}', "
                f"which this command reads: pass another OUTPUT",
            )
    assert weights.read_bytes() == original
    output = tmp_path / "out.pkl"
    output.write_text("a file of the user's")
    with pytest.raises(SystemExit) as exit_status:
        main(["convert-torchvision-to-d2.py", str(weights), str(output)])
    one_error_line(
        capsys,
        exit_status,
        f"convert-torchvision-to-d2.py's output '{output}' exists: pass another OUTPUT, or "
        f"--overwrite to replace it (python -m lambda_det.d2tool --overwrite "
        f"convert-torchvision-to-d2.py ...: d2tool's options go before SCRIPT)",
    )
    assert output.read_text() == "a file of the user's"
    main(["--overwrite", "convert-torchvision-to-d2.py", str(weights), str(output)])
    theirs = tmp_path / "theirs.pkl"
    run_unguarded(script, str(weights), str(theirs), monkeypatch=monkeypatch)
    ours, theirs = pickle.loads(output.read_bytes()), pickle.loads(theirs.read_bytes())
    assert ours.keys() == theirs.keys() and ours["model"].keys() == theirs["model"].keys()
    for key, value in theirs["model"].items():
        assert np.array_equal(ours["model"][key], value), key
    assert not list(tmp_path.glob(".d2tool-*"))


@pytest.fixture
def own_shapes(tmp_path, small_datasets_root, monkeypatch):
    """The 8-image shapes datasets, copied for this test (whose images a test may replace),
    registered from the copy."""
    root = tmp_path / "datasets"
    shutil.copytree(small_datasets_root, root)
    for _ in _shapes_registered_from(root, monkeypatch):
        yield root


def visualizer_command(script: str, tmp_path: Path) -> list:
    """Where each visualizer draws the validation images of the shapes datasets."""
    if script == "visualize_json_results.py":
        predictions = tmp_path / "predictions.json"
        box = {"image_id": 0, "category_id": 1, "bbox": [1, 1, 8, 8], "score": 0.9}
        predictions.write_text(json.dumps([box]))
        return [script, "--input", str(predictions), "--dataset", "lambda_det_shapes_val"]
    return [
        script,
        "--source",
        "annotation",
        "--config-file",
        DEMO_CONFIG,
        "DATASETS.TRAIN",
        "('lambda_det_shapes_val',)",
        "MODEL.DEVICE",
        "cpu",
    ]


@pytest.mark.parametrize(
    "script, option",
    [("visualize_json_results.py", "--output"), ("visualize_data.py", "--output-dir")],
)
def test_a_visualizer_writes_over_no_file_it_did_not_create(
    script, option, tmp_path, capsys, monkeypatch, own_shapes
):
    from lambda_det.data.shapes import VERSION

    script_or_skip(script)
    command = visualizer_command(script, tmp_path)

    def draw(folder: Path, *options: str) -> None:
        argv = [*options, *command]
        argv[argv.index(script) + 1 : argv.index(script) + 1] = [option, str(folder)]
        main(argv)

    images = own_shapes / f"lambda_det_shapes_{VERSION}" / "val"
    originals = {path.name: path.read_bytes() for path in images.iterdir()}
    for options in ([], ["--overwrite"]):  # the images it reads: never
        with pytest.raises(SystemExit) as exit_status:
            draw(images, *options)
        one_error_line(
            capsys, exit_status, f"{script}'s output '{images}/", "is an image this command reads"
        )
    assert {path.name: path.read_bytes() for path in images.iterdir()} == originals
    drawn = tmp_path / "drawn"
    draw(drawn)
    assert sorted(path.name for path in drawn.iterdir()) == sorted(originals)
    with pytest.raises(SystemExit) as exit_status:  # a file this command did not write
        draw(drawn)
    one_error_line(
        capsys,
        exit_status,
        f"{script}'s output '{drawn}/",
        f"exists: pass another {option}, or --overwrite",
    )
    draw(drawn, "--overwrite")
    assert not [path for path in drawn.iterdir() if path.name not in originals]  # no temporaries
    monkeypatch.setattr(ScriptFiles, "check", lambda self, path: None)  # the guard off
    draw(images)
    assert {path.name: path.read_bytes() for path in images.iterdir()} != originals
