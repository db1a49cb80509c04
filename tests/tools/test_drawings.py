"""The pictures of predict and the demo say the score a detection needed, and say so when an
image had none (an empty picture is otherwise indistinguishable from a broken model). The demo
replaces only its own earlier pictures and table (OUTPUT_DIR/run_files.json records them), and
refuses a user's file of their names before any work."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEMO_CONFIG, TINY_OVERRIDES, assert_one_line_error, exit_status
from detectron2.data import MetadataCatalog
from detectron2.structures import Boxes, Instances

from lambda_det.cli import demo
from lambda_det.cli.output_dir import (
    RECORD_FILE,
    check_tool_outputs,
    read_record,
    record_outputs,
    record_run,
)
from lambda_det.inference import draw, write_image
from lambda_det.run_config import load_config
from lambda_det.utils.errors import ExistingFileError

IMAGE = np.full((96, 160, 3), 90, np.uint8)
METADATA = MetadataCatalog.get("lambda_det_test_drawings").set(thing_classes=["a", "b"])


def predictions(count: int) -> dict:
    instances = Instances((96, 160))
    instances.pred_boxes = Boxes(torch.tensor([[100.0, 50.0, 150.0, 90.0]] * count))
    instances.scores = torch.full((count,), 0.9)
    instances.pred_classes = torch.zeros(count, dtype=torch.int64)
    return {"instances": instances}


def caption_columns(picture: np.ndarray) -> int:
    """How many columns of the top left band the drawing changed."""
    band = picture[:24, :100].astype(int) != IMAGE[:24, :100, ::-1].astype(int)
    return int(band.any(axis=(0, 2)).sum())


def test_no_caption_without_a_threshold():
    assert caption_columns(draw(IMAGE, predictions(0), METADATA, "BGR")) == 0


def test_the_caption_names_the_threshold_and_an_image_without_detections():
    with_detection = caption_columns(
        draw(IMAGE, predictions(1), METADATA, "BGR", score_threshold=0.5)
    )
    without = caption_columns(draw(IMAGE, predictions(0), METADATA, "BGR", score_threshold=0.5))
    assert with_detection > 0
    assert without > with_detection  # "score >= 0.5: no detection" is the longer caption


# ---- the demo's own files in OUTPUT_DIR ----

DEMO_OVERRIDES = [*TINY_OVERRIDES, "DATASETS.TEST", "('lambda_det_shapes_val',)"]
RESULTS = {"bbox": {"AP": 10.0, "APs": 5.0, "APm": 10.0, "APl": 20.0}}


def hashes(folder: Path) -> dict:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def finished_run(output: Path) -> list:
    """A finished demo run in ``output``, as train_net.py leaves it (its record first); returns
    the demo's command line for it."""
    output.mkdir(parents=True, exist_ok=True)
    record_run(output)
    overrides = [*DEMO_OVERRIDES, "OUTPUT_DIR", str(output)]
    config = load_config(DEMO_CONFIG, overrides).dump()
    (output / "eval_results.json").write_text(json.dumps({"config": config, "results": RESULTS}))
    (output / "model_final.pth").write_bytes(b"the run's weights")
    (output / "last_checkpoint").write_text("model_final.pth")
    return ["--config", DEMO_CONFIG, *overrides]


@pytest.fixture
def drawings(monkeypatch) -> list:
    """The demo's picture drawn by a stand-in (no model), a new one each call; the training
    refused (a finished run is reused). Returns the pictures drawn."""
    drawn = []

    def draw_predictions(cfg, weights, dataset, path, count=4):
        drawn.append(path)
        write_image(path, np.full((8, 8, 3), 10 * len(drawn), np.uint8), option="OUTPUT_DIR")
        return path

    def run_child(command):
        raise AssertionError(f"the demo trained: {command}")

    monkeypatch.setattr(demo, "draw_predictions", draw_predictions)
    monkeypatch.setattr(demo, "run_child", run_child)
    return drawn


def test_the_demo_replaces_its_own_pictures_and_only_those(
    tmp_path, shapes, drawings, capsys, monkeypatch
):
    output = tmp_path / "demo"
    argv = finished_run(output)
    assert demo.main(argv) == 0
    first = hashes(output)
    assert set(read_record(output)["files"]) == set(demo.DEMO_FILES)
    # Run again (make demo): the finished run is reused, its own pictures replaced.
    assert demo.main(argv) == 0 and len(drawings) == 2
    assert hashes(output)["predictions.png"] != first["predictions.png"]
    # A user's file of one of those names stops it before any work.
    (output / "ap_by_size.png").write_bytes(b"the user's chart")
    before = hashes(output)
    status, stderr = exit_status(demo.main, argv, capsys)
    assert_one_line_error(
        status,
        stderr,
        f"OUTPUT_DIR '{output}' holds ap_by_size.png, which the demo did not write "
        f"({RECORD_FILE} has no record of it as it is), and the demo writes: move it away, "
        f"or pass another OUTPUT_DIR",
    )
    assert hashes(output) == before and len(drawings) == 2
    # The negative control: without the check, the demo replaces the user's file.
    monkeypatch.setattr(demo, "check_tool_outputs", lambda *args: None)
    assert demo.main(argv) == 0
    assert (output / "ap_by_size.png").read_bytes() != b"the user's chart"


def test_the_demo_with_force_moves_its_own_pictures_with_the_run(
    tmp_path, shapes, drawings, monkeypatch
):
    output = tmp_path / "demo"
    argv = finished_run(output)
    (output / "notes.md").write_text("the user's notes")
    assert demo.main(argv) == 0
    earlier = hashes(output)

    def training(command):  # train_net.py --restart: its record, then its files
        assert "--restart" in command
        finished_run(output)
        return 0

    monkeypatch.setattr(demo, "run_child", training)
    assert demo.main([*argv, "--force"]) == 0
    (previous,) = output.glob("previous_*")
    moved = {*demo.DEMO_FILES, RECORD_FILE, "eval_results.json", "model_final.pth"}
    assert {name: earlier[name] for name in moved} == {
        name: value for name, value in hashes(previous).items() if name in moved
    }
    assert (output / "notes.md").read_text() == "the user's notes"
    assert set(read_record(output)["files"]) == set(demo.DEMO_FILES)  # the new run's pictures
    # A user's picture there: --force moves nothing and trains nothing.
    (output / "predictions.png").write_bytes(b"the user's picture")
    before = hashes(output)
    with pytest.raises(SystemExit) as exit_info:
        demo.main([*argv, "--force"])
    assert exit_info.value.code == 2 and hashes(output) == before


@pytest.mark.parametrize("kind", ["missing", "own", "changed", "users", "link", "folder"])
def test_only_a_tools_own_unchanged_files_may_be_replaced(kind, tmp_path):
    """What the demo and the comparison check before their work (check_tool_outputs)."""
    path = tmp_path / "predictions.png"
    if kind != "missing":
        path.write_bytes(b"the demo's picture")
        record_outputs(tmp_path, ["predictions.png"])
    if kind in ("changed", "users", "link", "folder"):
        path.unlink()
    if kind == "changed":
        path.write_bytes(b"the demo's picturE")  # same size, other bytes
    elif kind == "users":
        (tmp_path / RECORD_FILE).unlink()
        path.write_bytes(b"the demo's picture")  # the same bytes, but no record of them
    elif kind == "link":
        (tmp_path / "mine.png").write_bytes(b"the demo's picture")
        path.symlink_to(tmp_path / "mine.png")
    elif kind == "folder":
        path.mkdir()
    if kind in ("missing", "own"):
        check_tool_outputs(tmp_path, ["predictions.png"], "the demo", "OUTPUT_DIR")
        return
    with pytest.raises(ExistingFileError, match="holds predictions.png, which the demo did not"):
        check_tool_outputs(tmp_path, ["predictions.png"], "the demo", "OUTPUT_DIR")
