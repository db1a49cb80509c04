"""Users' files and mistakes: weights that would run code, two runs in one folder, and every
input error reported in one line (exit status 2) with the earlier run left as it was."""

import hashlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEMO_CONFIG as CONFIG
from conftest import (
    REPO_ROOT,
    assert_one_line_error,
    exit_status,
    run_tool,
    subprocess_env,
    tiny_model,
    tool_module,
    write_payload,
)
from conftest import TINY_OVERRIDES as TINY
from detectron2.modeling import build_model

import lambda_det.data
from lambda_det.checkpoint import (
    AtomicCheckpointer,
    CorruptCheckpointError,
    UnsafeCheckpointError,
    load_checkpoint_file,
    load_weights,
)
from lambda_det.cli import train_net
from lambda_det.cli.output_dir import OutputDirBusyError, OutputDirLock
from lambda_det.inference import Predictor
from lambda_det.run_config import load_config

lambda_det.data.register_datasets()  # the bundled datasets, by name: importing registers none

PAYLOAD_KINDS = {"pkl": "payload.pkl", "pth": "payload.pth", "pth-legacy": "legacy.pth"}
# The global each file is refused for, as named by the restricted unpickler (protocol-2 pickles
# spell builtins the Python 2 way) and by torch (bare names for builtins).
REFUSED = {"pkl": "__builtin__.exec", "pth": "exec", "pth-legacy": "exec"}


@pytest.mark.parametrize("kind", PAYLOAD_KINDS)
def test_payload_files_are_refused_without_running(tmp_path, kind):
    marker = tmp_path / "marker"
    path = write_payload(tmp_path / PAYLOAD_KINDS[kind], kind, marker)
    with pytest.raises(
        UnsafeCheckpointError, match=rf"checkpoint {path} refers to {REFUSED[kind]}"
    ):
        load_checkpoint_file(str(path))
    with pytest.raises(UnsafeCheckpointError):
        load_weights(tiny_model(), str(path))
    cfg = load_config(CONFIG, TINY + ["MODEL.WEIGHTS", str(path)])
    with pytest.raises(UnsafeCheckpointError):
        Predictor(cfg)  # what the demo draws its pictures with
    assert not marker.exists()


def test_the_marker_would_appear_without_the_restriction(tmp_path):
    """The negative control: the payload does run when unpickled naively."""
    marker = tmp_path / "marker"
    path = write_payload(tmp_path / "payload.pkl", "pkl", marker)
    pickle.loads(path.read_bytes())
    assert marker.exists()


def test_detectron2_and_caffe2_pickles_still_load(tmp_path):
    trained = tiny_model()
    weights = {key: value.numpy() for key, value in trained.state_dict().items()}
    detectron2_file = tmp_path / "model_zoo.pkl"
    detectron2_file.write_bytes(
        pickle.dumps(
            {"model": weights, "__author__": "Detectron2 Model Zoo", "matching_heuristics": True},
            protocol=2,
        )
    )
    model = build_model(load_config(CONFIG, TINY))
    load_weights(model, str(detectron2_file))
    for key, value in model.state_dict().items():
        assert torch.equal(value, trained.state_dict()[key]), key
    caffe2_file = tmp_path / "caffe2.pkl"  # Caffe2 layout: {"blobs": {name: array}}
    caffe2_file.write_bytes(
        pickle.dumps(
            {"blobs": {"conv1_w": np.ones((2, 3), np.float32), "conv1_w_momentum": np.ones(1)}}
        )
    )
    loaded = load_checkpoint_file(str(caffe2_file))
    assert loaded["__author__"] == "Caffe2" and loaded["matching_heuristics"]
    assert list(loaded["model"]) == ["conv1_w"]  # momentum buffers dropped, as detectron2 does


# ---- the command line: the tools' main(argv) in this process (tools/export_model.py once as a
# child process; tools/train_net.py's child processes: test_a_second_run_... and tests/engine/) ----


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` with a hash of its content."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != "run.lock"
    }


def assert_tool_refuses(tool: str, argv, capsys, *fragments: str) -> None:
    """``tools/TOOL.py argv`` (its main, in this process) stops with one ``error:`` line."""
    assert_one_line_error(*exit_status(tool_module(tool).main, argv, capsys), *fragments)


def object_array_bomb(path: Path) -> Path:
    """The issue's 100-byte file: {"model": {"w": <a numpy object array of 10**9 elements>}}, as
    numpy pickles an array (_reconstruct, then its state), with an empty list of elements."""
    reconstruct = np.zeros(1).__reduce__()[0]

    class Bomb:
        def __reduce__(self):
            return reconstruct, (np.ndarray, (0,), b"b"), (1, (10**9,), np.dtype(object), 0, [])

    path.write_bytes(pickle.dumps({"model": {"w": Bomb()}}, protocol=4))
    return path


def renamed_checkpoint(path: Path) -> Path:
    """A torch.save checkpoint named .safetensors."""
    torch.save({"model": {"w": torch.zeros(2)}}, path)
    return path


OVERSIZED_WEIGHTS = {
    "object array": (
        object_array_bomb,
        "weights.pkl",
        "a numpy array of shape (1000000000,) holds Python objects (dtype object)",
    ),
    "not safetensors": (
        renamed_checkpoint,
        "weights.safetensors",
        "is not a safetensors file (a .safetensors file begins with the length of its JSON",
    ),
}


@pytest.mark.parametrize("case", OVERSIZED_WEIGHTS)
@pytest.mark.e2e
def test_weights_that_claim_what_the_file_lacks_are_one_line(tmp_path, case, capsys):
    """--eval-only, where the object array took the evaluation past 6 GiB (the control of each:
    tests/checkpoint/test_checkpoint_files.py)."""
    write, name, fragment = OVERSIZED_WEIGHTS[case]
    path = write(tmp_path / name)
    assert path.stat().st_size < 2000
    argv = ["--config-file", CONFIG, "--eval-only", *TINY, "MODEL.WEIGHTS", path]
    argv += ["OUTPUT_DIR", tmp_path / "eval"]
    assert_tool_refuses("train_net", argv, capsys, str(path), fragment)
    assert not (tmp_path / "eval").exists()


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory) -> Path:
    """The folder of an interrupted run: a checkpoint, its pointer, logs and metrics (built once
    per module: tests copy it, :func:`earlier_run`)."""
    folder = tmp_path_factory.mktemp("interrupted") / "run"
    folder.mkdir()
    AtomicCheckpointer(tiny_model(), save_dir=str(folder)).save("model_0000000", iteration=0)
    for name in ("metrics.json", "log.txt", "config.yaml"):
        (folder / name).write_text(f"the earlier run's {name}\n")
    return folder


@pytest.fixture
def earlier_run(tmp_path, interrupted_run) -> Path:
    """An OUTPUT_DIR holding an interrupted run: this test's copy of :func:`interrupted_run`."""
    return Path(shutil.copytree(interrupted_run, tmp_path / "run"))


def payload_entry_points(path: Path, tmp_path: Path) -> dict:
    """The tools that load a weights file (MODEL.WEIGHTS ``path``): name -> (tool, argv)."""
    config = ["--config-file", CONFIG]
    weights = [*TINY, "MODEL.WEIGHTS", path]
    export = ["--format", "torchscript", "--output", tmp_path / "model.ts"]
    return {
        "training": ("train_net", [*config, *weights, "OUTPUT_DIR", tmp_path / "fresh"]),
        "evaluation": (
            "train_net",
            [*config, "--eval-only", *weights, "OUTPUT_DIR", tmp_path / "fresh"],
        ),
        "export": ("export_model", [*config, *export, *weights]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", PAYLOAD_KINDS)
@pytest.mark.e2e
def test_payload_weights_are_refused_at_every_entry_point(
    tmp_path, kind, shapes, earlier_run, capsys
):
    marker = tmp_path / "marker"
    path = write_payload(tmp_path / PAYLOAD_KINDS[kind], kind, marker)
    for name, (tool, argv) in payload_entry_points(path, tmp_path).items():
        assert_tool_refuses(tool, argv, capsys, str(path), REFUSED[kind])
        assert not marker.exists(), name
    # --resume: OUTPUT_DIR's last_checkpoint points at the payload.
    os.replace(path, earlier_run / path.name)
    (earlier_run / "last_checkpoint").write_text(path.name)
    before = snapshot(earlier_run)
    argv = ["--config-file", CONFIG, "--resume", *TINY, "OUTPUT_DIR", earlier_run]
    assert_tool_refuses("train_net", argv, capsys, path.name, REFUSED[kind])
    assert not marker.exists()
    assert snapshot(earlier_run) == before


@pytest.mark.slow
@pytest.mark.e2e
def test_the_export_script_refuses_payload_weights_in_one_line(tmp_path, datasets_root):
    """tools/export_model.py as a user runs it, a child process (the other entry points run as
    children in test_a_second_run_into_a_training_runs_folder_is_refused and tests/engine/)."""
    marker = tmp_path / "marker"
    path = write_payload(tmp_path / "payload.pth", "pth", marker)
    tool, argv = payload_entry_points(path, tmp_path)["export"]
    result = run_tool(f"{tool}.py", *argv, datasets_root=datasets_root)
    assert_one_line_error(result.returncode, result.stderr, str(path), REFUSED["pth"])
    assert not marker.exists()


BAD_INPUTS = {
    "unknown key": (["MODEL.LAMBDA_RESNET.DEPHT", "101"], ["MODEL.LAMBDA_RESNET.DEPHT"]),
    "wrong type": (["MODEL.LAMBDA_RESNET.DEPTH", "deep"], ["deep", "MODEL.LAMBDA_RESNET.DEPTH"]),
    "odd overrides": (["SOLVER.MAX_ITER"], ["KEY VALUE pairs"]),
    "depth": (["MODEL.LAMBDA_RESNET.DEPTH", "77"], ["got 77"]),
    "placement": (["MODEL.LAMBDA_RESNET.PLACEMENT", "LLXL"], ["'LLXL'"]),
    "scope": (["MODEL.LAMBDA_RESNET.SCOPE", "4"], ["scope", "got 4"]),
    "batch size 0": (["SOLVER.IMS_PER_BATCH", "0"], ["SOLVER.IMS_PER_BATCH", "got 0"]),
    "dataset": (
        ["DATASETS.TRAIN", "('lambda_det_shapes_trian',)"],
        ["'lambda_det_shapes_trian'", "lambda_det_shapes_train"],
    ),
    "test dataset": (["DATASETS.TEST", "('coco_2017_vall',)"], ["'coco_2017_vall'"]),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
@pytest.mark.e2e
def test_bad_input_is_one_line_and_changes_nothing(case, shapes, earlier_run, capsys):
    overrides, fragments = BAD_INPUTS[case]
    before = snapshot(earlier_run)
    argv = ["--config-file", CONFIG, "--resume", *TINY, "OUTPUT_DIR", earlier_run, *overrides]
    assert_tool_refuses("train_net", argv, capsys, *fragments)
    assert snapshot(earlier_run) == before


@pytest.mark.slow
@pytest.mark.e2e
def test_bad_weights_and_config_files_are_one_line(tmp_path, shapes, earlier_run, capsys):
    truncated = tmp_path / "truncated.pth"
    AtomicCheckpointer(tiny_model(), save_dir=str(tmp_path)).save("whole")
    truncated.write_bytes((tmp_path / "whole.pth").read_bytes()[:2000])
    other = tmp_path / "depth50.pth"  # weights of another architecture
    AtomicCheckpointer(
        build_model(load_config(CONFIG, TINY + ["MODEL.LAMBDA_RESNET.DEPTH", "50"])),
        save_dir=str(tmp_path),
    ).save("depth50")
    before = snapshot(earlier_run)
    cases = {
        "missing, training": (
            [*TINY, "MODEL.WEIGHTS", "nowhere/model.pth", "OUTPUT_DIR", tmp_path / "a"],
            ["nowhere/model.pth", "does not exist"],
        ),
        "truncated, training": (
            [*TINY, "MODEL.WEIGHTS", truncated, "OUTPUT_DIR", tmp_path / "a"],
            [str(truncated), "truncated or corrupt"],
        ),
        "mismatched, training": (
            [*TINY, "MODEL.WEIGHTS", other, "OUTPUT_DIR", tmp_path / "b"],
            [str(other), "does not fit the backbone"],
        ),
        "truncated, evaluation": (
            ["--eval-only", *TINY, "MODEL.WEIGHTS", truncated, "OUTPUT_DIR", tmp_path / "c"],
            [str(truncated)],
        ),
        "mismatched, evaluation": (
            ["--eval-only", *TINY, "MODEL.WEIGHTS", other, "OUTPUT_DIR", tmp_path / "d"],
            [str(other), "does not fit the model"],
        ),
        "finished run": ([*TINY, "OUTPUT_DIR", earlier_run], ["--resume", "--restart"]),
    }
    for name, (args, fragments) in cases.items():
        assert_tool_refuses("train_net", ["--config-file", CONFIG, *args], capsys, *fragments)
    argv = ["--config", "lambda_r26_shape", "OUTPUT_DIR", earlier_run]
    assert_tool_refuses("train_net", argv, capsys, "'lambda_r26_shape'", "lambda_r26_shapes.yaml")
    argv = ["--config", "lambda_r26_shapes", "--num-gpus", "2", *TINY, "SOLVER.IMS_PER_BATCH", "3"]
    argv += ["OUTPUT_DIR", tmp_path / "e"]
    assert_tool_refuses("train_net", argv, capsys, "SOLVER.IMS_PER_BATCH 3", "2 processes")
    assert snapshot(earlier_run) == before
    # --debug lets the same error through, with its traceback.
    argv = ["--config-file", CONFIG, "--debug", *TINY, "MODEL.WEIGHTS", truncated]
    with pytest.raises(CorruptCheckpointError, match="truncated or corrupt"):
        train_net.main([*map(str, argv), "OUTPUT_DIR", str(tmp_path / "f")])


# ---- one run per OUTPUT_DIR ----


@pytest.mark.slow
def test_output_dir_lock_names_the_holder_and_dies_with_it(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from lambda_det.cli.output_dir import "
            "OutputDirLock; OutputDirLock(sys.argv[1]).acquire(); print('held', flush=True); "
            "time.sleep(600)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=REPO_ROOT,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            OutputDirBusyError,
            match=rf"OUTPUT_DIR '{tmp_path}' is in use by "
            rf"another run \(pid {holder.pid} on ",
        ):
            OutputDirLock(str(tmp_path)).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel drops the lock
        holder.wait()
    with OutputDirLock(str(tmp_path)):
        assert f"pid {os.getpid()} " in (tmp_path / "run.lock").read_text()


@pytest.mark.slow
@pytest.mark.e2e
def test_a_second_run_into_a_training_runs_folder_is_refused(
    tmp_path, datasets_root, shapes, capsys
):
    output = tmp_path / "run"
    env = subprocess_env()
    env["DETECTRON2_DATASETS"] = str(datasets_root)
    first = subprocess.Popen(
        [
            sys.executable,
            str(REPO_ROOT / "tools/train_net.py"),
            "--config-file",
            CONFIG,
            *TINY,
            "SOLVER.MAX_ITER",
            "100000",
            "OUTPUT_DIR",
            str(output),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=REPO_ROOT,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline:  # until the first run has started training
            if (output / "metrics.json").is_file() or (output / "log.txt").is_file():
                break
            assert first.poll() is None, "the first run ended early"
            time.sleep(0.05)
        assert f"pid {first.pid} " in (output / "run.lock").read_text()
        for extra in ([], ["--eval-only", "MODEL.WEIGHTS", str(output / "model.pth")]):
            argv = ["--config-file", CONFIG, *extra, *TINY, "OUTPUT_DIR", output]
            assert_tool_refuses(
                "train_net",
                argv,
                capsys,
                f"OUTPUT_DIR '{output}' is in use by another run",
                f"pid {first.pid} ",
            )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    OutputDirLock(str(output)).acquire().release()  # a killed run leaves no stale lock
