"""``python -m lambda_det.d2tool``: no file given to one of detectron2's scripts runs code. Its
checkpointers read weights through lambda_det's safe loader, ``LazyConfig.load`` reads a yaml
with the safe loader; what detectron2 loads still loads, bit for bit; a refused or missing file
is one ``error:`` line with exit status 2."""

import copy
import json
import pickle

import numpy as np
import pytest
import torch
from conftest import DEMO_CONFIG, REPO_ROOT, overrides, tiny_model, write_payload
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import LazyConfig
from fvcore.common.checkpoint import Checkpointer
from torch import nn

from lambda_det.checkpoint import CorruptCheckpointError, UnsafeCheckpointError
from lambda_det.cli.d2tool import detectron2_tool_path, lambda_det_in_detectron2, main

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
        f"LazyConfig {config}, line 1: the yaml tag !!python/object/apply:builtins.exec is refused",
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
