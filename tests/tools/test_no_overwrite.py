"""No tool writes over a user's files: tools/predict.py, tools/export_model.py and --eval-only of
tools/train_net.py and tools/lazyconfig_train_net.py. Each case hashes every file of the folders
concerned before and after the command."""
import hashlib
import json
import os
from pathlib import Path
from typing import Dict

import cv2
import numpy as np
import pytest
import torch
from conftest import load_tool
import lambda_det.modeling  # noqa: F401  (registers the backbones)
from detectron2.config import instantiate
from detectron2.modeling import build_model
from lambda_det.checkpoint import AtomicCheckpointer
from lambda_det.cli.train_net import lazyconfig_main
from lambda_det.cli.output_dir import EVALUATION_PREFIX, evaluation_output_dir
from lambda_det.cli.train_net import main as train_net_main
from lambda_det.config import load_config
from lambda_det.config.lazy import load_lazy_config
from lambda_det.inference import collect_inputs, drawing_names

CONFIG = "lambda_r26_shapes"
TINY = ["MODEL.DEVICE", "cpu", "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER", "0.25",
        "MODEL.LAMBDA_RESNET.SCOPE", "3", "INPUT.MIN_SIZE_TEST", "64", "INPUT.MAX_SIZE_TEST", "64",
        "MODEL.RPN.POST_NMS_TOPK_TEST", "50", "TEST.DETECTIONS_PER_IMAGE", "5",
        "DATALOADER.NUM_WORKERS", "0", "DATASETS.TEST", "()"]
LAZY_TINY = ["model.backbone.bottom_up.width_multiplier=0.25", "model.backbone.bottom_up.scope=3",
             "dataloader.test.num_workers=0", "model.proposal_generator.post_nms_topk=[250,50]",
             "model.roi_heads.box_predictor.test_topk_per_image=5", "train.device=cpu"]
DATASET = "no_overwrite_val"  # a COCO-format dataset of two images (fixture `dataset`)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models: a second thread only fights the other processes for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def hashes(folder: Path) -> Dict[str, str]:
    """Every file under ``folder``: its path relative to ``folder`` -> sha256 of its bytes."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


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

def predict(*arguments, weights, model=True):
    tool = load_tool("predict")
    if not model:  # a refusal must come before the model is loaded
        tool.build_trained_model = model_not_loaded
    return tool.main([*map(str, arguments), "--config", CONFIG, *TINY,
                      "MODEL.WEIGHTS", str(weights)])


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_predict_into_its_input_folder_is_refused(overwrite, weights, tmp_path, capsys):
    photos = tmp_path / "photos"
    write_image(photos / "a.png", 40)
    write_image(photos / "b.jpg", 90)
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        predict("--input", photos, "--output", photos, *overwrite, weights=weights, model=False)
    assert exit_info.value.code == 2
    assert_one_line_error(capsys, f"--output '{photos}' holds the input '{photos / 'a.png'}'",
                          "pass another --output")
    assert hashes(tmp_path) == before


def test_predict_refuses_an_output_that_holds_an_input_it_would_not_draw_over(weights, tmp_path,
                                                                             capsys):
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
    assert predict("--input", first, second, own, "--output", output,
                   "--confidence-threshold", "0", weights=weights) == 0
    assert {name: value for name, value in hashes(tmp_path).items()
            if not name.startswith("out/")} == inputs
    drawn = hashes(output)
    assert sorted(drawn) == ["predictions.json", "x.png", "x_2.png", "x_3.png"]
    assert len({drawn["x.png"], drawn["x_2.png"], drawn["x_3.png"]}) == 3  # three pictures
    predicted = json.loads((output / "predictions.json").read_text())
    assert {result["file_name"] for result in predicted} == {str(first), str(second), str(own)}
    printed = capsys.readouterr().out
    assert f"{second} is drawn as {output / 'x_3.png'}" in printed
    assert "of 3 inputs" in printed and "3 drawn files" in printed


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
    tool = load_tool("export_model")
    if not model:
        tool.build_trained_model = model_not_loaded
    return tool.main(["--config", CONFIG, "--format", "torchscript", *map(str, arguments), *TINY,
                      "MODEL.WEIGHTS", str(weights)])


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
        assert_one_line_error(capsys, f"--output '{output}' is MODEL.WEIGHTS",
                              "pass another --output")
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
        assert_one_line_error(capsys, f"the metadata file '{user_file}' of --output exists",
                              "--overwrite")
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
        annotations.append({"id": index, "image_id": index, "category_id": 2, "iscrowd": 0,
                            "bbox": [10, 8, 30, 22], "area": 660,
                            "segmentation": [[10, 8, 40, 8, 40, 30, 10, 30]]})
    categories = [{"id": i + 1, "name": name} for i, name in
                  enumerate(("circle", "square", "triangle"))]
    (root / "val.json").write_text(json.dumps(
        {"images": images, "annotations": annotations, "categories": categories}))
    return [DATASET, str(root / "val.json"), str(root / "images")]


def fake_training_run(folder: Path, model: torch.nn.Module) -> None:
    """A finished run's files: the checkpoint, last_checkpoint, config, metrics, results."""
    folder.mkdir()
    AtomicCheckpointer(model, save_dir=str(folder)).save("model_final")  # + last_checkpoint
    for name, text in {"config.yaml": "the run's config", "metrics.json": '{"iteration": 9}',
                       "eval_results.json": '{"results": "the run\'s"}', "log.txt": "log",
                       f"inference/{DATASET}/coco_instances_results.json": "[]"}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def evaluation_folders(run: Path) -> list:
    return [path for path in run.iterdir()
            if path.is_dir() and path.name.startswith(EVALUATION_PREFIX)]


def assert_evaluated_beside_the_run(run: Path, before: Dict[str, str], printed: str) -> Path:
    """The run's files as they were; the evaluation's in the one new eval_<date-time>/."""
    after = hashes(run)
    assert {name: after.get(name) for name in before} == before
    (evaluation,) = evaluation_folders(run)
    assert set(after) - set(before) <= {"run.lock"} | {
        name for name in after if name.startswith(evaluation.name + "/")}
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
    evaluate = ["--config", CONFIG, "--eval-only", "--resume", "--coco-dataset", *dataset, *TINY,
                "DATASETS.TEST", f"('{DATASET}',)", "OUTPUT_DIR", str(run)]
    assert train_net_main(evaluate) == 0
    evaluation = assert_evaluated_beside_the_run(run, before, capsys.readouterr().out)
    # The run's last checkpoint is what was evaluated, and the evaluation's config says so.
    assert load_config(str(evaluation / "config.yaml")).MODEL.WEIGHTS == str(
        run / "model_final.pth")
    # A second evaluation goes to a folder of its own, too. (Its log also goes to the first
    # one's log.txt, as detectron2's loggers stay set up within this one test process.)
    first = {name: value for name, value in hashes(run).items()
             if name.startswith(evaluation.name) and not name.endswith("log.txt")}
    assert train_net_main(evaluate) == 0
    after = hashes(run)
    assert {name: after[name] for name in [*before, *first]} == {**before, **first}
    assert len(evaluation_folders(run)) == 2


@pytest.mark.e2e
def test_lazy_eval_only_into_a_training_run_writes_beside_it(dataset, tmp_path, capsys):
    overrides = [*LAZY_TINY, f"dataloader.test.dataset.names={DATASET}",
                 f"train.output_dir={tmp_path / 'run'}"]
    run = tmp_path / "run"
    fake_training_run(run, instantiate(load_lazy_config(CONFIG, overrides).model))
    before = hashes(run)
    assert lazyconfig_main(["--config", CONFIG, "--eval-only", "--resume",
                            "--coco-dataset", *dataset, *overrides]) == 0
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
