"""tools/predict.py reads every input before it loads the model: unreadable ones stop it in one
line naming them and --skip-unreadable, or are skipped with that flag; predictions.json holds
whatever was predicted, even when a later input fails."""

import json

import cv2
import numpy as np
import pytest
import torch
from detectron2.modeling import build_model
from test_prediction_checks import CONFIG, TINY, run_tool

from lambda_det import inference
from lambda_det.checkpoint import AtomicCheckpointer
from lambda_det.cli import predict
from lambda_det.run_config import load_config
from lambda_det.utils.errors import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread", "shapes")


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    """The tiny demo model's initialisation, saved as a checkpoint."""
    torch.manual_seed(0)
    model = build_model(load_config(CONFIG, TINY))
    folder = tmp_path_factory.mktemp("weights")
    AtomicCheckpointer(model, save_dir=str(folder)).save("model_final")
    return str(folder / "model_final.pth")


@pytest.fixture
def inputs(tmp_path):
    """Two readable photos and two unreadable files."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for index in range(2):
        picture = np.full((64, 96, 3), 60 * index, np.uint8)
        picture[10:40, 20:70] = (0, 0, 255)
        cv2.imwrite(str(folder / f"photo{index}.png"), picture)
    (folder / "scan.tif").write_bytes(b"II*\x00 not a tiff")
    (folder / "broken.png").write_bytes(b"not a picture")
    return folder


def argv(folder, output, weights, *more):
    return [
        "--config", CONFIG, "--input", str(folder), "--output", str(output), *more,
        *TINY, "MODEL.WEIGHTS", weights,
    ]  # fmt: skip


def test_unreadable_inputs_are_listed_before_the_model_loads(
    inputs, weights, tmp_path, monkeypatch, capsys
):
    def no_model(cfg):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(predict, "build_trained_model", no_model)
    error = run_tool("predict", argv(inputs, tmp_path / "out", weights), capsys)
    assert error.startswith("error: 2 of 4 inputs cannot be read: ")
    assert "broken.png" in error and "scan.tif" in error
    assert error.endswith(
        "convert or remove them, or pass --skip-unreadable to predict on the other 2"
    )
    assert not (tmp_path / "out").exists()


def test_without_the_check_the_model_loads_first(inputs, weights, tmp_path, monkeypatch):
    """The control: without unreadable_inputs the model is loaded before any input is read."""
    monkeypatch.setattr(predict, "unreadable_inputs", lambda files, image_format: {})
    monkeypatch.setattr(predict, "build_trained_model", lambda cfg: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        predict.main(argv(inputs, tmp_path / "out", weights))


def test_skip_unreadable_predicts_on_the_others(inputs, weights, tmp_path, capsys):
    output = tmp_path / "out"
    assert predict.main(argv(inputs, output, weights, "--skip-unreadable")) == 0
    out = capsys.readouterr().out
    assert "--skip-unreadable: skipping 2 of 4 inputs: " in out
    assert sorted(path.name for path in output.iterdir()) == [
        "photo0.png", "photo1.png", "predictions.json"
    ]  # fmt: skip


def at_the_second_batch(inputs, monkeypatch, action) -> None:
    """The readable photos alone, and ``action()`` run when the second batch is predicted."""
    for name in ("scan.tif", "broken.png"):
        (inputs / name).unlink()
    calls = []
    predict_batch = inference.Predictor.predict_batch

    def second_acts(self, images):
        calls.append(len(images))
        if len(calls) == 2:
            action()
        return predict_batch(self, images)

    monkeypatch.setattr(inference.Predictor, "predict_batch", second_acts)


def fail():
    raise UserError("the second input failed")


def test_predictions_of_the_inputs_before_a_failure_are_written(
    inputs, weights, tmp_path, monkeypatch, capsys
):
    at_the_second_batch(inputs, monkeypatch, fail)
    options = ["--confidence-threshold", "0.0"]
    error = run_tool("predict", argv(inputs, tmp_path / "out", weights, *options), capsys)
    assert error == "error: the second input failed"
    results = json.loads((tmp_path / "out/predictions.json").read_text())
    assert results and {result["file_name"] for result in results} == {str(inputs / "photo0.png")}


def test_an_interrupt_after_the_first_input_keeps_its_predictions(
    inputs, weights, tmp_path, monkeypatch, capsys
):
    import os
    import signal

    # predict's handler turns the signal into an exit
    at_the_second_batch(inputs, monkeypatch, lambda: os.kill(os.getpid(), signal.SIGINT))
    output = tmp_path / "out"
    options = ["--confidence-threshold", "0.0"]
    with pytest.raises(SystemExit) as exit_info:
        predict.main(argv(inputs, output, weights, *options))
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted by SIGINT: {output} holds the drawings finished so far and their "
        "detections in predictions.json; run the command again with --overwrite to redo them"
    )
    results = json.loads((output / "predictions.json").read_text())
    assert results and {result["file_name"] for result in results} == {str(inputs / "photo0.png")}
