"""No tool writes over a user's files (the output rule, lambda_det.utils.atomic.check_output_file):
tools/predict.py, tools/export_model.py, tools/ap_table.py, tools/convert_timm_checkpoint.py, the
benchmarks, --eval-only of tools/train_net.py and tools/lazyconfig_train_net.py, and a run's
run.lock. A file the command reads or a run owns is never replaced, another existing file only
with --overwrite, and a link is replaced rather than written through. Each case hashes every
file of the folders concerned before and after the command."""

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Dict
from unittest import mock

import cv2
import numpy as np
import pytest
import torch
from conftest import overrides, tiny_model, tool_module
from detectron2.config import instantiate
from detectron2.modeling import build_model

import lambda_det.modeling  # noqa: F401  (registers the backbones)
from lambda_det.checkpoint import AtomicCheckpointer
from lambda_det.cli import ap_table as ap_table_tool
from lambda_det.cli import convert_timm_checkpoint, export_model, lazyconfig_train_net
from lambda_det.cli import predict as predict_tool
from lambda_det.cli.output_dir import (
    EVALUATION_PREFIX,
    LOCK_FILE,
    OutputDirLock,
    evaluation_output_dir,
    prepare_output_dir,
    record_run,
)
from lambda_det.cli.train_net import main as train_net_main
from lambda_det.config import resolve_config_file
from lambda_det.config.lazy import load_lazy_config
from lambda_det.inference import collect_inputs, drawing_names
from lambda_det.run_config import load_config
from lambda_det.utils import atomic
from lambda_det.utils.atomic import OutputWriteError

CONFIG = "lambda_r26_shapes"
TINY = overrides(
    {
        "MODEL.DEVICE": "cpu",
        "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER": "0.25",
        "MODEL.LAMBDA_RESNET.SCOPE": "3",
        "INPUT.MIN_SIZE_TEST": "64",
        "INPUT.MAX_SIZE_TEST": "64",
        "MODEL.RPN.POST_NMS_TOPK_TEST": "50",
        "TEST.DETECTIONS_PER_IMAGE": "5",
        "DATALOADER.NUM_WORKERS": "0",
        "DATASETS.TEST": "()",
    }
)
LAZY_TINY = [
    "model.backbone.bottom_up.width_multiplier=0.25",
    "model.backbone.bottom_up.scope=3",
    "dataloader.test.num_workers=0",
    "model.proposal_generator.post_nms_topk=[250,50]",
    "model.roi_heads.box_predictor.test_topk_per_image=5",
    "train.device=cpu",
]
DATASET = "no_overwrite_val"  # a COCO-format dataset of two images (fixture `dataset`)
PREDICTIONS = f"inference/{DATASET}/coco_instances_results.json"  # a run's, in its folder


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models: a second thread only fights the other processes for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def hashes(folder: Path) -> Dict[str, str]:
    """Every file under ``folder``: its path relative to ``folder`` -> sha256 of its bytes (a
    link: ``-> target``)."""
    return {
        str(path.relative_to(folder)): f"-> {os.readlink(path)}"
        if path.is_symlink()
        else hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() or path.is_symlink()
    }


def write_image(path: Path, value: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = np.full((48, 64, 3), value, np.uint8)
    image[8:30, 10:40] = 255 - value
    cv2.imwrite(str(path), image)
    return path


def assert_one_line_error(capsys, *fragments: str) -> str:
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: "), errors
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """A checkpoint of the tiny model (random weights)."""
    folder = tmp_path_factory.mktemp("weights")
    AtomicCheckpointer(build_model(load_config(CONFIG, TINY)), save_dir=str(folder)).save("model")
    return folder / "model.pth"


def model_not_loaded(*args, **kwargs):
    raise AssertionError("the tool loaded the model before refusing its --output")


# ---- tools/predict.py ----


def without(module, name: str, replace: bool = True):
    """``module.name`` replaced by :func:`model_not_loaded` while in the block (``replace``)."""
    return (
        mock.patch.object(module, name, model_not_loaded) if replace else contextlib.nullcontext()
    )


def predict(*arguments, weights, model=True, config=CONFIG):
    # a refusal must come before the model is loaded
    with without(predict_tool, "build_trained_model", replace=not model):
        return predict_tool.main(
            [*map(str, arguments), "--config", str(config), *TINY, "MODEL.WEIGHTS", str(weights)]
        )


def user_config(folder: Path) -> Path:
    """A config of the user's: the shipped one, as a _BASE_."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(f"_BASE_: {resolve_config_file(CONFIG)}\n")
    return path


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_predict_into_its_input_folder_is_refused(overwrite, weights, tmp_path, capsys):
    photos = tmp_path / "photos"
    write_image(photos / "a.png", 40)
    write_image(photos / "b.jpg", 90)
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        predict("--input", photos, "--output", photos, *overwrite, weights=weights, model=False)
    assert exit_info.value.code == 2
    assert_one_line_error(
        capsys, f"--output '{photos}' holds the input '{photos / 'a.png'}'", "pass another --output"
    )
    assert hashes(tmp_path) == before


def test_predict_refuses_an_output_that_holds_an_input_it_would_not_draw_over(
    weights, tmp_path, capsys
):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "clip.avi").write_bytes(b"a video; drawn as clip.mp4")
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        predict("--input", folder / "clip.avi", "--output", folder, weights=weights, model=False)
    assert exit_info.value.code == 2
    assert_one_line_error(capsys, f"holds the input '{folder / 'clip.avi'}'", "--overwrite")
    assert hashes(tmp_path) == before


@pytest.mark.e2e
def test_predict_refuses_to_draw_over_earlier_drawings(weights, tmp_path, capsys):
    image = write_image(tmp_path / "photos" / "a.png", 40)
    output = tmp_path / "drawn"
    write_image(output / "a.png", 200)  # an earlier run's drawing, or the user's own file
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        predict("--input", image, "--output", output, weights=weights, model=False)
    assert exit_info.value.code == 2
    assert_one_line_error(capsys, f"--output '{output}' already holds a.png", "--overwrite")
    assert hashes(tmp_path) == before

    # --overwrite replaces the drawing (and writes predictions.json); the input stays as it is.
    assert predict("--input", image, "--output", output, "--overwrite", weights=weights) == 0
    after = hashes(tmp_path)
    assert after["photos/a.png"] == before["photos/a.png"]
    assert after["drawn/a.png"] != before["drawn/a.png"]
    assert sorted(after) == ["drawn/a.png", "drawn/predictions.json", "photos/a.png"]


@pytest.mark.e2e
def test_predict_keeps_inputs_of_one_name_apart(weights, tmp_path, capsys):
    first = write_image(tmp_path / "a" / "x.png", 40)
    second = write_image(tmp_path / "b" / "x.png", 160)
    own = write_image(tmp_path / "b" / "x_2.png", 220)  # the renamed drawing must not take it
    inputs = hashes(tmp_path)
    output = tmp_path / "out"
    assert (
        predict(
            "--input",
            first,
            second,
            own,
            "--output",
            output,
            "--confidence-threshold",
            "0",
            weights=weights,
        )
        == 0
    )
    assert {
        name: value for name, value in hashes(tmp_path).items() if not name.startswith("out/")
    } == inputs
    drawn = hashes(output)
    assert sorted(drawn) == ["predictions.json", "x.png", "x_2.png", "x_3.png"]
    assert len({drawn["x.png"], drawn["x_2.png"], drawn["x_3.png"]}) == 3  # three pictures
    predicted = json.loads((output / "predictions.json").read_text())
    assert {result["file_name"] for result in predicted} == {str(first), str(second), str(own)}
    printed = capsys.readouterr().out
    assert f"{second} is drawn as {output / 'x_3.png'}" in printed
    assert "of 3 inputs" in printed and "3 drawn files" in printed


@pytest.mark.parametrize("read", ["MODEL.WEIGHTS", "--config"])
def test_predict_never_writes_over_a_file_it_reads(read, weights, tmp_path, capsys):
    """Not even with --overwrite: MODEL.WEIGHTS kept as predictions.json in --output, or a
    drawing's name in --output linked to the config."""
    image = write_image(tmp_path / "photos" / "a.png", 40)
    output = tmp_path / "out"
    output.mkdir()
    config = user_config(tmp_path / "user")
    if read == "MODEL.WEIGHTS":
        written, read_path = "predictions.json", output / "predictions.json"
        read_path.write_bytes(weights.read_bytes())
        weights = read_path
    else:
        written, read_path = "a.png", config
        (output / "a.png").symlink_to(config)
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        predict(
            "--input",
            image,
            "--output",
            output,
            "--overwrite",
            weights=weights,
            model=False,
            config=config,
        )
    assert exit_info.value.code == 2
    assert_one_line_error(
        capsys,
        f"--output '{output}' holds {read} '{read_path}', which would be written over by {written}",
        "pass another --output",
    )
    assert hashes(tmp_path) == before


@pytest.mark.slow
@pytest.mark.e2e
def test_predict_replaces_links_in_its_output_rather_than_writing_through_them(weights, tmp_path):
    """--overwrite over a drawing, a video and predictions.json that are links to the user's
    files: the links are replaced by the new files; the files they led to stay as they were."""
    image = write_image(tmp_path / "photos" / "a.png", 40)
    video = tmp_path / "photos" / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 5, (64, 48))
    for value in (40, 120):
        writer.write(cv2.imread(str(write_image(tmp_path / "frame.png", value))))
    writer.release()
    user = tmp_path / "user"
    output = tmp_path / "out"
    output.mkdir()
    for name in ("a.png", "clip.mp4", "predictions.json"):
        (user / name).parent.mkdir(exist_ok=True)
        (user / name).write_bytes(b"the user's own " + name.encode())
        (output / name).symlink_to(user / name)
    before = hashes(user)
    assert predict("--input", image, video, "--output", output, "--overwrite", weights=weights) == 0
    assert hashes(user) == before
    for name in ("a.png", "clip.mp4", "predictions.json"):
        assert not (output / name).is_symlink() and (output / name).stat().st_size > 0, name
    assert cv2.imread(str(output / "a.png")).shape == (48, 64, 3)
    assert cv2.VideoCapture(str(output / "clip.mp4")).read()[0]  # a video with a frame
    assert sorted(path.name for path in output.iterdir()) == [  # no temporary file left
        "a.png",
        "clip.mp4",
        "predictions.json",
    ]


def test_drawing_names_are_distinct_and_deterministic():
    files = ["a/x.png", "b/x.png", "c/X.PNG", "d/x_2.png", "v/x.avi", "w/x.mp4", "e/y.jpg"]
    names = drawing_names(files)
    assert names == ["x.png", "x_3.png", "X_4.PNG", "x_2.png", "x.mp4", "x_2.mp4", "y.jpg"]
    assert drawing_names(files) == names
    assert len({name.lower() for name in names}) == len(files)


def test_an_input_named_twice_is_predicted_once(tmp_path):
    image = write_image(tmp_path / "photos" / "a.png", 40)
    write_image(tmp_path / "photos" / "b.png", 90)
    files = collect_inputs([str(image), str(tmp_path / "photos"), str(tmp_path / "photos/*.png")])
    assert files == [str(image), str(tmp_path / "photos" / "b.png")]


# ---- tools/export_model.py ----


def export(*arguments, weights, model=True):
    with without(export_model, "build_trained_model", replace=not model):
        return export_model.main(
            [
                "--config",
                CONFIG,
                "--format",
                "torchscript",
                *map(str, arguments),
                *TINY,
                "MODEL.WEIGHTS",
                str(weights),
            ]
        )


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_export_never_writes_over_its_weights(overwrite, weights, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    trained = run / "model_final.pth"
    trained.write_bytes(weights.read_bytes())
    (tmp_path / "link.pth").symlink_to(trained)
    before = hashes(tmp_path)
    for output in (trained, run / ".." / "run" / "model_final.pth", tmp_path / "link.pth"):
        with pytest.raises(SystemExit) as exit_info:
            export("--output", output, *overwrite, weights=trained, model=False)
        assert exit_info.value.code == 2
        assert_one_line_error(
            capsys, f"--output '{output}' is MODEL.WEIGHTS", "pass another --output"
        )
        assert hashes(tmp_path) == before


def test_export_refuses_an_existing_file_without_overwrite(weights, tmp_path, capsys):
    output = tmp_path / "model.ts"
    output.write_bytes(b"an earlier export, or any file of the user's")
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        export("--output", output, weights=weights, model=False)
    assert exit_info.value.code == 2
    assert_one_line_error(capsys, f"--output '{output}' exists", "--overwrite")
    assert hashes(tmp_path) == before
    with pytest.raises(SystemExit) as exit_info:
        export("--output", tmp_path, weights=weights, model=False)
    assert exit_info.value.code == 2
    assert_one_line_error(capsys, f"--output '{tmp_path}' is a folder")
    assert hashes(tmp_path) == before


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_export_guards_its_metadata_file_too(overwrite, weights, tmp_path, capsys):
    """<output>.json, written beside the model, is refused as the model file is."""
    user_file = tmp_path / "model.ts.json"
    user_file.write_text("{}")
    trained = tmp_path / "model.pth.json"
    trained.write_bytes(weights.read_bytes())
    before = hashes(tmp_path)
    if not overwrite:
        with pytest.raises(SystemExit) as exit_info:
            export("--output", tmp_path / "model.ts", weights=weights, model=False)
        assert exit_info.value.code == 2
        assert_one_line_error(
            capsys, f"the metadata file '{user_file}' of --output exists", "--overwrite"
        )
    with pytest.raises(SystemExit) as exit_info:  # never the checkpoint, even with --overwrite
        export("--output", tmp_path / "model.pth", *overwrite, weights=trained, model=False)
    assert exit_info.value.code == 2
    assert_one_line_error(capsys, f"the metadata file '{trained}' of --output is MODEL.WEIGHTS")
    assert hashes(tmp_path) == before


@pytest.mark.slow
@pytest.mark.e2e
def test_export_with_overwrite_replaces_the_file(weights, tmp_path):
    output = tmp_path / "model.ts"
    output.write_bytes(b"an earlier export")
    assert export("--output", output, "--overwrite", weights=weights) == 0
    assert output.read_bytes()[:2] == b"PK"  # a TorchScript archive now


@pytest.mark.parametrize("read", ["--config", "--sample-image"])
def test_export_never_writes_over_a_file_it_reads(read, weights, tmp_path, capsys):
    """Not even with --overwrite (MODEL.WEIGHTS: the tests above)."""
    config = user_config(tmp_path / "user")
    sample = write_image(tmp_path / "user" / "sample.png", 40)
    target = config if read == "--config" else sample
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        export(
            "--config",
            config,
            "--sample-image",
            sample,
            "--output",
            target,
            "--overwrite",
            weights=weights,
            model=False,
        )
    assert exit_info.value.code == 2
    assert_one_line_error(
        capsys, f"--output '{target}' is {read}, which this command reads", "pass another --output"
    )
    assert hashes(tmp_path) == before


# ---- tools/ap_table.py ----


def ap_table(*arguments) -> int:
    return ap_table_tool.main([*map(str, arguments)])


def finished_run(folder: Path, recorded: bool = False) -> Path:
    """A run's folder with its config, results, checkpoint and predictions (as bytes of their
    own); ``recorded``: with the record of its files that a run writes first."""
    folder.mkdir(parents=True)
    if recorded:
        record_run(folder)
    (folder / PREDICTIONS).parent.mkdir(parents=True)
    (folder / PREDICTIONS).write_text("[]")
    (folder / "config.yaml").write_text("the run's config")
    (folder / "model_final.pth").write_text("the run's checkpoint")
    (folder / "eval_results.json").write_text(
        json.dumps(
            {"config": "", "results": {"bbox": {"AP": 40.0, "APs": 20.0, "APm": 45.0, "APl": 55.0}}}
        )
    )
    return folder


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
@pytest.mark.parametrize(
    "option, name, read",
    [
        ("--plot", "eval_results.json", "."),
        ("--output", "config.yaml", "."),
        ("--output", "eval_results.json", "eval_results.json"),
        ("--output", "model_final.pth", "."),
        ("--output", "link.md", "."),
    ],
)
def test_ap_table_never_writes_over_a_run_it_reads(option, name, read, overwrite, tmp_path, capsys):
    """Not even with --overwrite: the run's results, config or checkpoint, by name or by a link
    to one of them."""
    run = finished_run(tmp_path / "run")
    target = run / name
    if name == "link.md":
        target = tmp_path / "link.md"
        target.symlink_to(run / "eval_results.json")
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        ap_table(run / read if read != "." else run, option, target, *overwrite)
    assert exit_info.value.code == 2
    error = assert_one_line_error(capsys, f"{option} '{target}' is ")
    assert "which this command reads" in error or not overwrite, error
    assert hashes(tmp_path) == before


def test_ap_table_replaces_an_existing_file_only_with_overwrite(tmp_path, capsys):
    run = finished_run(tmp_path / "run")
    table = tmp_path / "table.md"
    table.write_text("the user's notes")
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        ap_table(run, "--output", table)
    assert exit_info.value.code == 2
    assert_one_line_error(capsys, f"--output '{table}' exists", "--overwrite")
    assert hashes(tmp_path) == before
    assert ap_table(run, "--output", table, "--overwrite") == 0
    assert table.read_text().startswith("| Backbone |")
    # A link is replaced by the table, the file it led to kept as it was.
    notes = tmp_path / "notes.md"
    notes.write_text("the user's notes")
    table.unlink()
    table.symlink_to(notes)
    assert ap_table(run, "--output", table, "--overwrite") == 0
    assert not table.is_symlink() and table.read_text().startswith("| Backbone |")
    assert notes.read_text() == "the user's notes"
    with pytest.raises(SystemExit):
        ap_table(run, "--output", tmp_path / "one", "--plot", tmp_path / "one")
    assert_one_line_error(capsys, "--output and --plot name one file")


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
@pytest.mark.parametrize("read", [True, False])
def test_ap_table_never_writes_over_a_runs_predictions(read, overwrite, tmp_path, capsys):
    """--output RUN/inference/<set>/coco_instances_results.json, of the run the table reads
    (``read``: a file in a folder of that run) or of another run (one with its record)."""
    run = finished_run(tmp_path / "run", recorded=True)
    other = finished_run(tmp_path / "other")
    target = run / PREDICTIONS
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        ap_table(run if read else other, "--output", target, *overwrite)
    assert exit_info.value.code == 2
    expected = (
        f"is inside a folder of the run '{run}' (inference/), which this command reads"
        if read
        else f"belongs to the run in '{run}' (inside its inference/): a run's files are never "
        f"written over, not even with --overwrite"
    )
    assert_one_line_error(capsys, f"--output '{target}' {expected}: pass another --output")
    assert hashes(tmp_path) == before


def test_without_its_guards_the_table_would_replace_a_runs_predictions(tmp_path, monkeypatch):
    """The negative control of the test above: the checks of the folder a file is in and of the
    run that owns it off, and the table goes over the run's predictions."""
    run = finished_run(tmp_path / "run", recorded=True)
    monkeypatch.setattr(atomic, "_is_inside", lambda path, folder: False)
    monkeypatch.setattr(ap_table_tool, "run_owner", lambda path: None)
    before = (run / PREDICTIONS).read_bytes()
    assert ap_table(run, "--output", run / PREDICTIONS, "--overwrite") == 0
    assert (run / PREDICTIONS).read_bytes() != before


# ---- a file a run owns, by every other tool ----


def export_into(target: Path, weights: Path, inputs: Path) -> None:
    export("--output", target, "--overwrite", weights=weights, model=False)


def convert_into(target: Path, weights: Path, inputs: Path) -> None:
    arguments = ["--config", CONFIG, str(inputs / "classifier.pth"), str(target), "--overwrite"]
    with without(convert_timm_checkpoint, "load_checkpoint_file"):
        convert_timm_checkpoint.main(arguments)


def predict_into(target: Path, weights: Path, inputs: Path) -> None:
    image = inputs / "photo.png"
    predict(
        "--input", image, "--output", target.parent, "--overwrite", weights=weights, model=False
    )


def benchmark_into(tool: str, option: str):
    def run(target: Path, weights: Path, inputs: Path) -> None:
        module = tool_module(tool)
        with (
            mock.patch.object(module, "benchmark_detector", model_not_loaded, create=True),
            mock.patch.object(module, "run", model_not_loaded, create=True),
        ):
            module.main([option, str(target.parent), "--overwrite"])

    return run


RUN_OWNED = {
    # tool: (how it writes into a run's folder, the file, the module whose run_owner it asks,
    # how its error names the file)
    "export_model": (export_into, "config.yaml", export_model, "--output '{0}'"),
    "convert_timm_checkpoint": (
        convert_into,
        "model_final.pth",
        convert_timm_checkpoint,
        "output file '{0}'",
    ),
    "predict": (
        predict_into,
        f"inference/{DATASET}/predictions.json",
        predict_tool,
        "--output '{0.parent}': {0.name}",
    ),
    "benchmark_lambda": (
        benchmark_into("benchmark_lambda", "--out"),
        f"inference/{DATASET}/results.md",
        "benchmark_lambda",
        "--out '{0}'",
    ),
    "benchmark_detector": (
        benchmark_into("benchmark_detector", "--output"),
        f"inference/{DATASET}/table.md",
        "benchmark_detector",
        "--output '{0}'",
    ),
}


@pytest.mark.parametrize("tool", list(RUN_OWNED))
def test_no_tool_writes_over_a_file_a_run_owns(tool, weights, tmp_path, capsys, monkeypatch):
    """Not even with --overwrite: a run's config.yaml or checkpoint, a file in its inference/.
    The negative control: without the owner's check the tool goes on to its work (the model
    or the measurement, here a failing stand-in) before writing there."""
    write_into, name, module, what = RUN_OWNED[tool]
    inputs = tmp_path / "inputs"
    write_image(inputs / "photo.png", 40)
    (inputs / "classifier.pth").write_bytes(b"a timm checkpoint")
    run = finished_run(tmp_path / "run", recorded=True)
    target = run / name
    target.write_text("the run's own file")
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        write_into(target, weights, inputs)
    assert exit_info.value.code == 2
    owner = f"the run in '{run}' ({'inside its inference/' if '/' in name else 'its ' + name})"
    assert_one_line_error(capsys, f"{what.format(target)} belongs to {owner}: a run's files are")
    assert hashes(tmp_path) == before
    module = tool_module(module) if isinstance(module, str) else module
    monkeypatch.setattr(module, "run_owner", lambda path: None)
    with pytest.raises(AssertionError, match="before refusing"):
        write_into(target, weights, inputs)


# ---- tools/convert_timm_checkpoint.py ----


@pytest.mark.parametrize("target", ["classifier", "config", "existing"])
def test_convert_never_writes_over_what_it_reads_and_an_existing_file_only_with_overwrite(
    target, tmp_path, capsys
):
    config = user_config(tmp_path / "user")
    classifier = tmp_path / "user" / "classifier.pth"
    classifier.write_bytes(b"a timm checkpoint")
    output = {
        "classifier": classifier,
        "config": config,
        "existing": tmp_path / "user" / "detector.pth",
    }[target]
    output.write_bytes(output.read_bytes() if output.exists() else b"an earlier conversion")
    before = hashes(tmp_path)
    overwrite = [] if target == "existing" else ["--overwrite"]
    # a refusal comes before reading the classifier
    with (
        pytest.raises(SystemExit) as exit_info,
        without(convert_timm_checkpoint, "load_checkpoint_file"),
    ):
        convert_timm_checkpoint.main(
            ["--config", str(config), str(classifier), str(output), *overwrite]
        )
    assert exit_info.value.code == 2
    expected = {
        "classifier": "is the classifier checkpoint, which this command reads",
        "config": "is --config, which this command reads",
        "existing": "exists: pass another output file, or --overwrite",
    }[target]
    assert_one_line_error(capsys, f"output file '{output}' {expected}")
    assert hashes(tmp_path) == before


# ---- the benchmarks' result folders ----


@pytest.mark.parametrize(
    "tool, option, name",
    [("benchmark_lambda", "--out", "results.md"), ("benchmark_detector", "--output", "table.md")],
)
def test_a_benchmark_replaces_earlier_results_only_with_overwrite(
    tool, option, name, tmp_path, capsys, monkeypatch
):
    """Refused before any measurement (the measuring function would fail the test)."""
    (tmp_path / name).write_text("an earlier run's results")
    before = hashes(tmp_path)
    module = tool_module(tool)
    for function in ("run", "benchmark_detector"):
        if hasattr(module, function):
            monkeypatch.setattr(module, function, model_not_loaded)
    with pytest.raises(SystemExit) as exit_info:
        module.main([option, str(tmp_path)])
    assert exit_info.value.code == 2
    assert_one_line_error(
        capsys, f"{option} '{tmp_path / name}' exists", f"pass another {option}, or --overwrite"
    )
    assert hashes(tmp_path) == before
    with pytest.raises(AssertionError, match="before refusing"):  # --overwrite goes on to measure
        module.main([option, str(tmp_path), "--overwrite"])


def test_the_detector_benchmark_never_writes_over_a_config_it_reads(tmp_path, capsys):
    config = tmp_path / "table.md"  # a config of the user's, at the name of the table
    config.write_text(f"_BASE_: {resolve_config_file(CONFIG)}\n")
    before = hashes(tmp_path)
    module = tool_module("benchmark_detector")
    with mock.patch.object(module, "benchmark_detector", model_not_loaded):
        with pytest.raises(SystemExit) as exit_info:
            module.main(["--configs", str(config), "--output", str(tmp_path), "--overwrite"])
        assert exit_info.value.code == 2
        assert_one_line_error(
            capsys, f"--output '{config}' is --configs '{config}', which this command reads"
        )
        assert hashes(tmp_path) == before
        # The negative control: another config, and --overwrite goes on to measure.
        with pytest.raises(AssertionError, match="before refusing"):
            module.main(["--configs", CONFIG, "--output", str(tmp_path), "--overwrite"])


# ---- OUTPUT_DIR/run.lock and the files detectron2 writes in place ----


@pytest.mark.parametrize("kind", ["link", "foreign file", "hard link"])
def test_the_lock_never_writes_a_file_it_did_not_make(kind, tmp_path):
    output = tmp_path / "run"
    output.mkdir()
    user = tmp_path / "user.txt"
    user.write_text("the user's own file")
    lock = output / LOCK_FILE
    if kind == "link":
        lock.symlink_to(user)
    elif kind == "hard link":
        os.link(user, lock)
    else:
        lock.write_text("the user's notes, named run.lock")
    before = hashes(tmp_path)
    with pytest.raises(
        OutputWriteError,
        match=f"'{lock}' is (a symbolic link|not a run's lock file).*pass another OUTPUT_DIR",
    ):
        OutputDirLock(str(output)).acquire()
    assert hashes(tmp_path) == before
    # The negative control: an earlier run's lock file is taken over.
    lock.unlink()
    lock.write_text("pid 1 on host, started 2020-01-01T00:00:00+00:00\n")
    with OutputDirLock(str(output)):
        assert lock.read_text().startswith(f"pid {os.getpid()} on ")


@pytest.mark.slow
@pytest.mark.e2e
def test_training_with_a_linked_run_lock_is_one_line(tmp_path, capsys):
    output = tmp_path / "run"
    output.mkdir()
    user = tmp_path / "user.txt"
    user.write_text("the user's own file")
    (output / LOCK_FILE).symlink_to(user)
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        train_net_main(["--config", CONFIG, *TINY, "OUTPUT_DIR", str(output)])
    assert exit_info.value.code == 2
    assert_one_line_error(
        capsys,
        f"'{output / LOCK_FILE}' is a symbolic link",
        "remove the link, or pass another OUTPUT_DIR",
    )
    assert hashes(tmp_path) == before


def test_resuming_refuses_a_link_at_a_file_detectron2_appends_to(tmp_path):
    run = tmp_path / "run"
    fake_training_run(run, tiny_model())
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's own file")
    (run / "log.txt").unlink()
    (run / "log.txt").symlink_to(notes)
    before = hashes(tmp_path)
    with pytest.raises(
        OutputWriteError, match=f"'{run / 'log.txt'}' is a symbolic link.*pass --restart"
    ):
        prepare_output_dir(str(run), resume=True, restart=False)
    assert hashes(tmp_path) == before
    (run / "log.txt").unlink()  # the negative control: a plain log.txt is continued
    (run / "log.txt").write_text("log")
    assert prepare_output_dir(str(run), resume=True, restart=False) is None


# ---- --eval-only ----


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> list:
    """A COCO-format dataset of two images with one square each (of the shapes' 3 classes),
    as the --coco-dataset triple."""
    root = tmp_path_factory.mktemp("dataset")
    images, annotations = [], []
    for index in (1, 2):
        write_image(root / "images" / f"{index}.png", 40 * index)
        images.append({"id": index, "file_name": f"{index}.png", "height": 48, "width": 64})
        annotations.append(
            {
                "id": index,
                "image_id": index,
                "category_id": 2,
                "iscrowd": 0,
                "bbox": [10, 8, 30, 22],
                "area": 660,
                "segmentation": [[10, 8, 40, 8, 40, 30, 10, 30]],
            }
        )
    categories = [
        {"id": i + 1, "name": name} for i, name in enumerate(("circle", "square", "triangle"))
    ]
    (root / "val.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return [DATASET, str(root / "val.json"), str(root / "images")]


def fake_training_run(folder: Path, model: torch.nn.Module) -> None:
    """A finished run's files: the checkpoint, last_checkpoint, config, metrics, results."""
    folder.mkdir()
    AtomicCheckpointer(model, save_dir=str(folder)).save("model_final")  # + last_checkpoint
    for name, text in {
        "config.yaml": "the run's config",
        "metrics.json": '{"iteration": 9}',
        "eval_results.json": '{"results": "the run\'s"}',
        "log.txt": "log",
        f"inference/{DATASET}/coco_instances_results.json": "[]",
    }.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def evaluation_folders(run: Path) -> list:
    return [
        path for path in run.iterdir() if path.is_dir() and path.name.startswith(EVALUATION_PREFIX)
    ]


def assert_evaluated_beside_the_run(run: Path, before: Dict[str, str], printed: str) -> Path:
    """The run's files as they were; the evaluation's in the one new eval_<date-time>/."""
    after = hashes(run)
    assert {name: after.get(name) for name in before} == before
    (evaluation,) = evaluation_folders(run)
    assert set(after) - set(before) <= {"run.lock"} | {
        name for name in after if name.startswith(evaluation.name + "/")
    }
    assert f"writes into {evaluation}" in printed
    assert (evaluation / "eval_results.json").is_file()
    assert (evaluation / "inference" / DATASET / "coco_instances_results.json").is_file()
    return evaluation


@pytest.mark.slow
@pytest.mark.e2e
def test_eval_only_into_a_training_run_writes_beside_it(dataset, tmp_path, capsys):
    run = tmp_path / "run"
    fake_training_run(run, build_model(load_config(CONFIG, TINY)))
    before = hashes(run)
    evaluate = [
        "--config",
        CONFIG,
        "--eval-only",
        "--resume",
        "--coco-dataset",
        *dataset,
        *TINY,
        "DATASETS.TEST",
        f"('{DATASET}',)",
        "OUTPUT_DIR",
        str(run),
    ]
    assert train_net_main(evaluate) == 0
    evaluation = assert_evaluated_beside_the_run(run, before, capsys.readouterr().out)
    # The run's last checkpoint is what was evaluated, and the evaluation's config says so.
    assert load_config(str(evaluation / "config.yaml")).MODEL.WEIGHTS == str(
        run / "model_final.pth"
    )
    # A second evaluation goes to a folder of its own, too. (Its log also goes to the first
    # one's log.txt, as detectron2's loggers stay set up within this one test process.)
    first = {
        name: value
        for name, value in hashes(run).items()
        if name.startswith(evaluation.name) and not name.endswith("log.txt")
    }
    assert train_net_main(evaluate) == 0
    after = hashes(run)
    assert {name: after[name] for name in [*before, *first]} == {**before, **first}
    assert len(evaluation_folders(run)) == 2


@pytest.mark.e2e
def test_lazy_eval_only_into_a_training_run_writes_beside_it(dataset, tmp_path, capsys):
    overrides = [
        *LAZY_TINY,
        f"dataloader.test.dataset.names={DATASET}",
        f"train.output_dir={tmp_path / 'run'}",
    ]
    run = tmp_path / "run"
    fake_training_run(run, instantiate(load_lazy_config(CONFIG, overrides).model))
    before = hashes(run)
    assert (
        lazyconfig_train_net.main(
            ["--config", CONFIG, "--eval-only", "--resume", "--coco-dataset", *dataset, *overrides]
        )
        == 0
    )
    assert_evaluated_beside_the_run(run, before, capsys.readouterr().out)


def test_an_evaluation_writes_into_a_folder_without_a_run(tmp_path):
    assert evaluation_output_dir(str(tmp_path / "new")) == str(tmp_path / "new")
    (tmp_path / "notes.md").write_text("not a run's")
    assert evaluation_output_dir(str(tmp_path)) == str(tmp_path)
    (tmp_path / "eval_results.json").write_text("{}")  # an earlier evaluation
    folder = evaluation_output_dir(str(tmp_path))
    assert os.path.isdir(folder) and Path(folder).parent == tmp_path
    assert Path(folder).name.startswith(EVALUATION_PREFIX) and not os.listdir(folder)
    assert evaluation_output_dir(str(tmp_path)) not in (folder, str(tmp_path))
