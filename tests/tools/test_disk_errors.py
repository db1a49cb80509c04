"""Disks that cannot be written (read-only, full, /sys) and checkpoint pointers that point
nowhere: every tool stops with one ``error: ...`` line and exit status 2 naming the path and the
fix, before its work where it can, and a run whose checkpoint cannot be saved stops at once
without evaluating a model that no checkpoint holds.

Tests run as root, which ignores file permissions: a read-only folder is one under /sys (or
/proc), where even root cannot create files, and a full disk is /dev/full (a file path) or a
save that raises ``OSError(ENOSPC)``."""

import errno
import json
import pickle

import cv2
import numpy as np
import pytest
import torch
from conftest import (
    CONFIGS,
    LAZY_TINY_OVERRIDES,
    assert_one_line_error,
    exit_status,
    tiny_model,
    tool_module,
    write_payload,
)
from conftest import TINY_OVERRIDES as TINY
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.engine.hooks import EvalHook

import lambda_det.data
from lambda_det.checkpoint import (
    AtomicCheckpointer,
    CorruptCheckpointError,
    UnsafeCheckpointError,
    checkpoint_to_resume,
    load_checkpoint_file,
    load_weights,
)
from lambda_det.checkpoint import checkpointer as checkpoint_module
from lambda_det.cli import convert_timm_checkpoint, demo, lazyconfig_train_net, predict, train_net
from lambda_det.cli.checks import check_device
from lambda_det.engine.trainer import FinalEvalHook, Trainer
from lambda_det.run_config import load_config
from lambda_det.utils.atomic import OutputWriteError, atomic_path, check_writable_folder

lambda_det.data.register_datasets()  # the bundled datasets, by name: importing registers none

CONFIG = str(CONFIGS / "Demo/lambda_r26_shapes.yaml")
LAZY_CONFIG = str(CONFIGS / "LazyConfigs/Demo/lambda_r26_shapes.py")
READ_ONLY = "/sys/lambda_det_test_output"  # even root cannot create it
ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def tool_main(name: str):
    """The main(argv) of the tool ``name`` (conftest.tool_module)."""
    return tool_module(name).main


def assert_each_run_is_one_line_error(runs: dict, capsys, *fragments: str):
    """Each of ``runs`` ({"<tool> [what]": argv}), its tool's main(argv) in this process: a user's
    mistake, one ``error:`` line holding each fragment."""
    for name, argv in runs.items():
        status, stderr = exit_status(tool_main(name.split()[0]), argv, capsys)
        assert_one_line_error(status, stderr, *fragments)


# ---- the writable-folder check and atomic writes ----


@pytest.mark.parametrize(
    "folder, reason",
    [
        (READ_ONLY, "Operation not permitted"),
        ("/proc/lambda_det_test", "No such file"),
        ("/dev/full", "a file of that name is in the way"),
        ("/dev/full/x", "Not a directory"),
    ],
)
def test_unwritable_folders_are_named(folder, reason):
    with pytest.raises(OutputWriteError, match=f"cannot write '{folder}': {reason}.*--output"):
        check_writable_folder(folder, "--output")


def test_the_check_leaves_nothing_behind(tmp_path):
    check_writable_folder(tmp_path / "a" / "b", "--output")
    assert list(tmp_path.iterdir()) == []  # the folders it created for the probe are gone


def test_a_full_disk_in_an_atomic_write_names_the_file(tmp_path):
    target = tmp_path / "results.json"
    with pytest.raises(
        OutputWriteError,
        match=f"cannot write '{target}': No space left on device: free space on that disk",
    ):
        with atomic_path(target) as temporary, open(temporary, "w") as f:
            f.write("{}")
            raise ENOSPC
    assert list(tmp_path.iterdir()) == []  # no temporary file left


# ---- MODEL.DEVICE ----


def test_a_gpu_that_is_not_there_is_named(monkeypatch):
    """The one-process tools' check (predict, export, the demo): preflight's, with num_gpus 1."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    cfg = load_config(CONFIG, ["MODEL.DEVICE", "cuda"])
    with pytest.raises(
        ValueError,
        match="MODEL.DEVICE 'cuda' needs a CUDA GPU, and torch finds "
        "none on this machine: set MODEL.DEVICE to cpu",
    ):
        check_device(cfg)
    with pytest.raises(ValueError, match="--device 'cuda' needs a CUDA GPU"):
        check_device(cfg, key="--device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device(cfg)  # the negative control: a machine with GPUs
    with pytest.raises(ValueError, match=r"'cuda:2': this machine has 2 CUDA GPU\(s\)"):
        check_device(load_config(CONFIG, ["MODEL.DEVICE", "cuda:2"]))
    with pytest.raises(ValueError, match="'gpu' is not a torch device"):
        check_device(load_config(CONFIG, ["MODEL.DEVICE", "gpu"]))
    check_device(load_config(CONFIG, ["MODEL.DEVICE", "cpu"]))


# ---- a run whose checkpoint cannot be saved ----


class FakeTrainer:
    def __init__(self, iteration, max_iter):
        self.iter, self.max_iter = iteration, max_iter


@pytest.mark.parametrize("iteration, evaluates", [(3, False), (4, True), (5, True)])
def test_the_final_evaluation_needs_every_iteration_completed(iteration, evaluates):
    """iter 3 of max_iter 4: the last iteration raised (TrainerBase.train counts to max_iter
    after the loop; max_iter + 1 when a finished run is resumed)."""
    calls = []
    hook = FinalEvalHook(0, lambda: calls.append("evaluated"))
    hook.trainer = FakeTrainer(iteration, max_iter=4)
    hook.after_train()
    assert calls == (["evaluated"] if evaluates else [])
    # The negative control: detectron2's hook evaluates after a failed last iteration.
    detectron2_hook = EvalHook(0, lambda: calls.append("detectron2"))
    detectron2_hook.trainer = FakeTrainer(3, max_iter=4)
    detectron2_hook.after_train()
    assert calls[-1] == "detectron2"


def full_after(saves: int, monkeypatch):
    """torch.save fills the disk after ``saves`` complete files: a partial write, then ENOSPC."""
    real_save, done = torch.save, []

    def save(data, f, *args, **kwargs):
        if len(done) >= saves:
            f.write(b"PK\x03\x04 part of a checkpoint")
            raise ENOSPC
        done.append(f.name)
        return real_save(data, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "save", save)


def test_a_failed_save_names_the_last_complete_checkpoint(tmp_path, monkeypatch):
    checkpointer = AtomicCheckpointer(tiny_model(), save_dir=str(tmp_path))
    full_after(1, monkeypatch)
    checkpointer.save("model_0000004", iteration=4)
    with pytest.raises(
        OutputWriteError,
        match=(
            f"saving checkpoint {tmp_path / 'model_0000009.pth'} failed \\(No space left on "
            f"device\\): the run stopped and its last complete checkpoint is model_0000004.pth "
            f"\\(last_checkpoint\\); free space on that disk, then continue it with --resume"
        ),
    ):
        checkpointer.save("model_0000009", iteration=9)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "last_checkpoint",
        "model_0000004.pth",
    ]


class FillingDisk:
    """A file on a disk that fills after its first kilobyte: a write beyond raises ENOSPC."""

    def __init__(self, file):
        self.file = file

    def write(self, data):
        if self.file.tell() + len(data) > 1024:
            raise ENOSPC
        return self.file.write(data)

    def flush(self):
        self.file.flush()


def test_torch_saving_onto_a_full_disk_is_one_error_naming_the_checkpoint(tmp_path, monkeypatch):
    """torch.save into a file whose write fails raises RuntimeError ("unexpected pos") while
    the file's OSError is handled (two tracebacks): the save names the file and the fix."""
    real_save = torch.save
    with (
        pytest.raises(RuntimeError, match="unexpected pos") as raised,
        open(tmp_path / "plain.pth", "wb") as f,
    ):
        real_save({"weights": torch.zeros(100_000)}, FillingDisk(f))  # torch alone
    assert isinstance(raised.value.__context__, OSError)
    (tmp_path / "plain.pth").unlink()
    monkeypatch.setattr(
        checkpoint_module.torch, "save", lambda data, f: real_save(data, FillingDisk(f))
    )
    checkpointer = AtomicCheckpointer(tiny_model(), save_dir=str(tmp_path))
    with pytest.raises(
        OutputWriteError,
        match=(
            f"saving checkpoint {tmp_path / 'model_0000001.pth'} failed \\(No space left on "
            f"device\\): the run stopped and it has saved no checkpoint; free space on that "
            f"disk"
        ),
    ) as raised:
        checkpointer.save("model_0000001", iteration=1)
    assert isinstance(raised.value.__cause__, OSError)
    assert list(tmp_path.iterdir()) == []
    # Another RuntimeError of torch.save is not a write error: it goes on as it is.
    monkeypatch.setattr(
        checkpoint_module.torch, "save", lambda data, f: torch.zeros(2) @ torch.zeros(3)
    )
    with pytest.raises(RuntimeError, match="inconsistent tensor size"):
        checkpointer.save("model_0000001", iteration=1)


TRAINING = ["--config-file", CONFIG, *TINY, "SOLVER.CHECKPOINT_PERIOD", "1"]


@pytest.mark.slow
@pytest.mark.e2e
def test_a_full_disk_stops_training_without_a_final_evaluation(
    tmp_path, monkeypatch, capsys, shapes
):
    """Iteration 0's checkpoint is saved, then the disk is full: the run stops at iteration 1
    with one line, last_checkpoint still names iteration 0's file and no evaluation ran; with
    space again, --resume finishes the run and evaluates it."""
    output = tmp_path / "run"
    evaluations = []
    monkeypatch.setattr(
        Trainer,
        "test",
        classmethod(lambda cls, cfg, model: evaluations.append(cfg.SOLVER.MAX_ITER) or {}),
    )
    real_save = torch.save
    full_after(1, monkeypatch)
    status, stderr = exit_status(train_net.main, [*TRAINING, "OUTPUT_DIR", output], capsys)
    assert_one_line_error(
        status,
        stderr,
        f"saving checkpoint {output / 'model_0000001.pth'}",
        "No space left on device",
        "last complete checkpoint is model_0000000.pth",
        "--resume",
    )
    assert (output / "last_checkpoint").read_text() == "model_0000000.pth"
    assert not (output / "model_final.pth").exists() and not list(output.glob("*.tmp"))
    assert evaluations == []
    log = (output / "log.txt").read_text()
    assert "model_0000000.pth (last_checkpoint)" in log and "Traceback" not in log
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)  # space again
    status, stderr = exit_status(
        train_net.main, ["--resume", *TRAINING, "OUTPUT_DIR", output], capsys
    )
    assert status == 0, stderr[-3000:]
    assert (output / "last_checkpoint").read_text() == "model_final.pth"
    assert evaluations == [2]


# ---- every tool that writes files: a read-only or full output folder, before any work ----


def tool_runs(tmp_path, folder):
    """{tool: (argv, the option the message names)} of every tool that writes files, writing
    into ``folder``. The inputs they would read after the check need not exist: the check comes
    first."""
    missing = tmp_path / "not_read.pth"
    image = tmp_path / "image.png"
    image.write_bytes(b"")  # collected by its suffix, never read
    return {
        "train_net": (["--config-file", CONFIG, *TINY, "OUTPUT_DIR", folder], "OUTPUT_DIR"),
        "lazyconfig_train_net": (
            ["--config-file", LAZY_CONFIG, f"train.output_dir={folder}"],
            "train.output_dir",
        ),
        "predict": (
            [
                "--config-file",
                CONFIG,
                "--input",
                image,
                "--output",
                folder,
                *TINY,
                "MODEL.WEIGHTS",
                missing,
            ],
            "--output",
        ),
        "export_model": (
            [
                "--config-file",
                CONFIG,
                "--format",
                "torchscript",
                "--output",
                f"{folder}/model.ts",
                *TINY,
                "MODEL.WEIGHTS",
                missing,
            ],
            "--output",
        ),
        "demo": (["--config", CONFIG, *TINY, "OUTPUT_DIR", folder], "OUTPUT_DIR"),
        "convert_timm_checkpoint": (
            ["--config", CONFIG, missing, f"{folder}/detector.pth"],
            "the output file",
        ),
        "compare_backbones": (["--config", CONFIG, "--seeds", "0", "--output", folder], "--output"),
        "ap_table": ([missing, "--output", f"{folder}/table.md"], "--output"),
        "benchmark_detector": (["--configs", CONFIG, "--output", folder], "--output"),
        "benchmark_lambda": (["--out", folder], "--out"),
    }


TOOLS = [
    "train_net",
    "lazyconfig_train_net",
    "predict",
    "export_model",
    "demo",
    "convert_timm_checkpoint",
    "compare_backbones",
    "ap_table",
    "benchmark_detector",
    "benchmark_lambda",
]


@pytest.mark.parametrize("tool", TOOLS)
def test_a_read_only_output_folder_is_one_line(tool, tmp_path, capsys):
    argv, option = tool_runs(tmp_path, READ_ONLY)[tool]
    status, stderr = exit_status(tool_main(tool), argv, capsys)
    assert_one_line_error(
        status,
        stderr,
        f"cannot write '{READ_ONLY}'",
        "Operation not permitted",
        f"pass {option} in a folder you can write to",
    )


@pytest.mark.parametrize("tool", [tool for tool in TOOLS if not tool.endswith("train_net")])
def test_a_full_output_disk_is_one_line(tool, tmp_path, capsys, monkeypatch):
    """The check's probe file cannot be synced (ENOSPC); the two training tools are the
    checkpoint tests above."""
    folder = tmp_path / "out"

    def full(handle):
        raise ENOSPC

    monkeypatch.setattr("os.fsync", full)
    argv, option = tool_runs(tmp_path, folder)[tool]
    status, stderr = exit_status(tool_main(tool), argv, capsys)
    assert_one_line_error(
        status,
        stderr,
        f"cannot write '{folder}': No space left on device",
        f"free space on that disk, or pass {option} on another one",
    )
    assert not folder.exists()  # the check removed the folder it made


# ---- last_checkpoint naming no checkpoint ----


def broken_pointer(folder, problem):
    """A run folder with a checkpoint whose last_checkpoint names ``problem``."""
    folder.mkdir(parents=True, exist_ok=True)
    AtomicCheckpointer(tiny_model(), save_dir=str(folder)).save("model_0000000", iteration=0)
    pointer = {"missing": "model_0000009.pth", "empty": "", "folder": "inference"}[problem]
    (folder / "inference").mkdir()
    (folder / "last_checkpoint").write_text(pointer)
    return folder


POINTER_ERRORS = {
    "missing": (FileNotFoundError, "names 'model_0000009.pth', which does not exist"),
    "empty": (ValueError, "is empty"),
    "folder": (IsADirectoryError, "names 'inference', a folder, not a checkpoint"),
}


@pytest.mark.parametrize("problem", POINTER_ERRORS)
def test_a_last_checkpoint_that_names_no_checkpoint_is_named(tmp_path, problem):
    folder = broken_pointer(tmp_path / "run", problem)
    error, message = POINTER_ERRORS[problem]
    with pytest.raises(
        error,
        match=f"{folder / 'last_checkpoint'} {message}: write the name "
        f"of one of the run's checkpoints \\(model_0000000.pth\\)",
    ):
        checkpoint_to_resume(str(folder))
    (folder / "last_checkpoint").write_text("model_0000000.pth")  # the negative control
    assert checkpoint_to_resume(str(folder)) == str(folder / "model_0000000.pth")


@pytest.mark.parametrize(
    "tool",
    ["checkpoint_to_resume", pytest.param("train_net", marks=[pytest.mark.slow, pytest.mark.e2e])],
)
def test_a_binary_last_checkpoint_is_named(tool, tmp_path, capsys, request):
    folder = broken_pointer(tmp_path / "run", "missing")
    (folder / "last_checkpoint").write_bytes(b"\x80\x04 a pickle, not a file name")
    if tool == "checkpoint_to_resume":
        with pytest.raises(
            ValueError,
            match=f"'{folder / 'last_checkpoint'}' is not utf-8 text "
            f"\\(byte 0 is 0x80.*write the name of one of "
            f"the run's checkpoints",
        ):
            checkpoint_to_resume(str(folder))
        return
    request.getfixturevalue("shapes")  # train_net checks its datasets first
    status, stderr = exit_status(
        train_net.main, ["--resume", "--config-file", CONFIG, *TINY, "OUTPUT_DIR", folder], capsys
    )
    assert_one_line_error(status, stderr, f"'{folder / 'last_checkpoint'}' is not utf-8 text")


@pytest.mark.parametrize(
    "problem",
    [
        "missing",
        pytest.param("empty", marks=pytest.mark.slow),
        pytest.param("folder", marks=pytest.mark.slow),
    ],
)
def test_resuming_from_a_broken_last_checkpoint_is_one_line(tmp_path, problem, capsys, shapes):
    """train_net --resume, --eval-only --resume, the lazy tool and the comparison (whose runs
    train_net.py resumes) stop before launch."""
    from lambda_det.cli.comparison import RECIPE_FILE, parse_variant, plan_comparison

    comparison = tmp_path / "comparison"
    run = plan_comparison(CONFIG, [], [parse_variant("conv")], [0], str(comparison)).runs[0]
    folder = broken_pointer(run.folder, problem)
    (folder / RECIPE_FILE).write_text(run.recipe)
    runs = {
        "train_net": ["--resume", "--config-file", CONFIG, *TINY, "OUTPUT_DIR", folder],
        "train_net --eval-only": [
            "--eval-only",
            "--resume",
            "--config-file",
            CONFIG,
            *TINY,
            "OUTPUT_DIR",
            folder,
        ],
        "lazyconfig_train_net": [
            "--resume",
            "--config-file",
            LAZY_CONFIG,
            f"train.output_dir={folder}",
        ],
        "compare_backbones": [
            "--config",
            CONFIG,
            "--variant",
            "conv",
            "--seeds",
            "0",
            "--output",
            comparison,
        ],
    }
    assert_each_run_is_one_line_error(
        runs,
        capsys,
        f"{folder / 'last_checkpoint'}",
        POINTER_ERRORS[problem][1],
        "model_0000000.pth",
    )


@pytest.mark.e2e
def test_convert_creates_a_missing_output_folder(tmp_path, capsys):
    classifier = tmp_path / "classifier.pth"
    torch.save({"state_dict": tiny_model().backbone.bottom_up.state_dict()}, classifier)
    output = tmp_path / "new" / "folder" / "detector.pth"
    status, stderr = exit_status(
        convert_timm_checkpoint.main, ["--config", CONFIG, classifier, output, *TINY], capsys
    )
    assert status == 0, stderr[-3000:]
    assert load_checkpoint_file(str(output))["model"]


# ---- weights files: protocols, object arrays, refused torch files ----


def pickled_weights(path, protocol=2, convert=lambda array: array):
    model = tiny_model()
    weights = {key: convert(value.numpy()) for key, value in model.state_dict().items()}
    path.write_bytes(pickle.dumps({"model": weights, "__author__": "someone"}, protocol=protocol))
    return model, path


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_pickled_weights_of_plain_numbers_load_as_they_are(tmp_path, protocol):
    """Numeric arrays in every protocol (protocol 5 stores them through numpy's _frombuffer)."""
    trained, path = pickled_weights(tmp_path / "weights.pkl", protocol)
    model = tiny_model()
    torch.nn.init.zeros_(next(model.parameters()))
    load_weights(model, str(path))
    for key, value in model.state_dict().items():
        assert torch.equal(value, trained.state_dict()[key]), key


def strings_in(array):
    texts = np.empty(array.shape, dtype=object)
    texts[...] = "0.5"
    return texts


@pytest.mark.parametrize(
    "convert",
    [strings_in, lambda array: array.astype(object)],
    ids=["strings", "numbers"],
)
def test_pickled_weights_of_python_objects_are_refused_by_name(tmp_path, convert):
    """An object array is no weight, even of numbers: detectron2's own loader cannot turn one
    into a tensor either (the control)."""
    _, path = pickled_weights(tmp_path / "weights.pkl", convert=convert)
    with pytest.raises(
        CorruptCheckpointError,
        match=f"checkpoint {path}: a numpy array of shape "
        r"\(\d+(, \d+)*\) holds Python objects \(dtype object\), not numbers",
    ):
        load_checkpoint_file(str(path))
    with pytest.raises(TypeError, match="can't convert np.ndarray of type numpy.object_"):
        DetectionCheckpointer(tiny_model()).load(str(path))  # plain pickle: our own file


@pytest.mark.slow
def test_pickled_weights_of_python_objects_are_one_line_at_every_entry_point(
    tmp_path, capsys, shapes
):
    _, path = pickled_weights(tmp_path / "weights.pkl", convert=strings_in)
    image = tmp_path / "image.png"
    cv2.imwrite(str(image), np.full((64, 64, 3), 128, np.uint8))  # read before the weights
    runs = {
        "train_net": [
            "--config-file",
            CONFIG,
            *TINY,
            "MODEL.WEIGHTS",
            path,
            "OUTPUT_DIR",
            tmp_path / "train",
        ],
        "train_net --eval-only": [
            "--eval-only",
            "--config-file",
            CONFIG,
            *TINY,
            "MODEL.WEIGHTS",
            path,
            "OUTPUT_DIR",
            tmp_path / "eval",
        ],
        "predict": [
            "--config-file",
            CONFIG,
            "--input",
            image,
            "--output",
            tmp_path / "drawn",
            *TINY,
            "MODEL.WEIGHTS",
            path,
        ],
        "export_model": [
            "--config-file",
            CONFIG,
            "--format",
            "torchscript",
            "--output",
            tmp_path / "model.ts",
            *TINY,
            "MODEL.WEIGHTS",
            path,
        ],
    }
    assert_each_run_is_one_line_error(
        runs,
        capsys,
        f"checkpoint {path}: a numpy array of shape",
        "holds Python objects (dtype object), not numbers",
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["image.png", "weights.pkl"]


class Trusted:
    """A class of the user's own in a checkpoint."""


@pytest.mark.parametrize(
    "extra, refused, advice",
    [
        (
            Trusted(),
            "test_disk_errors.Trusted",
            "torch.serialization.safe_globals([test_disk_errors.Trusted])",
        ),
        (print, "print", "runs code and has no place in a weights file: do not load it"),
    ],
)
def test_refused_torch_files_get_only_safe_advice(tmp_path, extra, refused, advice):
    path = tmp_path / "weights.pth"
    torch.save({"model": tiny_model().state_dict(), "extra": extra}, path)
    with pytest.raises(UnsafeCheckpointError) as error:
        load_checkpoint_file(str(path))
    message = str(error.value)
    assert f"refers to {refused}," in message and advice in message
    assert "torch.save(model.state_dict()" in message
    assert "weights_only=False" not in message  # would run the file's code if pasted


# ---- the demo reusing a finished run, predict's drawings, MODEL.DEVICE in the tools ----


def test_the_demo_reusing_a_run_with_refused_weights_is_one_line(tmp_path, capsys, shapes):

    output = tmp_path / "demo"
    output.mkdir()
    marker = tmp_path / "marker"
    write_payload(output / "model_final.pth", "pth", marker)
    overrides = [*TINY, "DATASETS.TEST", "('lambda_det_shapes_val',)", "OUTPUT_DIR", str(output)]
    record = {
        "config": load_config(CONFIG, overrides).dump(),
        "results": {"bbox": {"AP": 1.0, "APs": 1.0, "APm": 1.0, "APl": 1.0}},
    }
    (output / "eval_results.json").write_text(json.dumps(record))
    status, stderr = exit_status(demo.main, ["--config", CONFIG, *overrides], capsys)
    assert_one_line_error(
        status, stderr, f"checkpoint {output / 'model_final.pth'} refers to exec", "do not load it"
    )
    assert not marker.exists()
    assert sorted(path.name for path in output.iterdir()) == [
        "eval_results.json",
        "model_final.pth",
    ]


def test_predict_stops_at_a_drawing_it_cannot_write(tmp_path, capsys, monkeypatch):
    import cv2

    weights = tmp_path / "weights"
    weights.mkdir()
    AtomicCheckpointer(tiny_model(), save_dir=str(weights)).save("model_final")
    image = tmp_path / "image.png"
    cv2.imwrite(str(image), np.full((64, 64, 3), 128, np.uint8))
    monkeypatch.setattr(cv2, "imwrite", lambda path, picture: False)  # OpenCV's failure: False
    output = tmp_path / "drawn"
    status, stderr = exit_status(
        predict.main,
        [
            "--config-file",
            CONFIG,
            "--input",
            image,
            "--output",
            output,
            *TINY,
            "MODEL.WEIGHTS",
            weights / "model_final.pth",
        ],
        capsys,
    )
    assert_one_line_error(
        status,
        stderr,
        f"cannot write '{output / 'image.png'}'",
        "OpenCV could not write the image",
        "--output",
    )
    # the image was predicted before its drawing failed: its detections are kept
    assert isinstance(json.loads((output / "predictions.json").read_text()), list)


@pytest.mark.parametrize("tool", ["predict", "export_model", "demo"])
def test_a_gpu_that_is_not_there_is_one_line_in_the_tools(tool, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    argv, _ = tool_runs(tmp_path, tmp_path / "out")[tool]
    status, stderr = exit_status(tool_main(tool), [*argv, "MODEL.DEVICE", "cuda"], capsys)
    assert_one_line_error(status, stderr, "MODEL.DEVICE 'cuda' needs a CUDA GPU")
    assert not (tmp_path / "out").exists()


LAZY_TRAINING = [
    "--config-file",
    LAZY_CONFIG,
    "train.max_iter=2",
    "train.checkpointer.period=1",
    *LAZY_TINY_OVERRIDES,
]


@pytest.mark.slow
@pytest.mark.e2e
def test_a_full_disk_stops_lazy_training_without_a_final_evaluation(
    tmp_path, monkeypatch, capsys, shapes
):
    from lambda_det.engine import lazy_training

    output = tmp_path / "run"
    evaluations = []
    monkeypatch.setattr(lazy_training, "evaluate", lambda cfg, model: evaluations.append(1) or {})
    full_after(1, monkeypatch)
    status, stderr = exit_status(
        lazyconfig_train_net.main, [*LAZY_TRAINING, f"train.output_dir={output}"], capsys
    )
    assert_one_line_error(
        status,
        stderr,
        f"saving checkpoint {output / 'model_0000001.pth'}",
        "last complete checkpoint is model_0000000.pth",
        "--resume",
    )
    assert (output / "last_checkpoint").read_text() == "model_0000000.pth"
    assert evaluations == []
