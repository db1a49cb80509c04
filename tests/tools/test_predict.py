"""tools/predict.py: predictions on image files, folders and videos, matching evaluation."""

import json

import cv2
import numpy as np
import pytest
from conftest import TINY_EVALUATED_RUN, assert_one_line_error, exit_status
from pycocotools import mask as mask_util
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from lambda_det.cli import predict
from lambda_det.reports import load_results


def predict_tool(argv, capsys):
    """(exit status, stderr) of tools/predict.py's main(argv), with the overrides of
    conftest's evaluated_run (the README's quick start runs the script as a child process)."""
    return exit_status(predict.main, [*argv, *TINY_EVALUATED_RUN], capsys)


def by_image(results):
    grouped = {}
    for result in results:
        grouped.setdefault(result["image_id"], []).append(result)
    return {key: sorted(value, key=lambda r: -r["score"]) for key, value in grouped.items()}


@pytest.mark.slow
@pytest.mark.e2e
def test_predictions_match_the_evaluators(
    evaluated_run, small_datasets_root, small_shapes, tmp_path, capsys
):
    trained = evaluated_run / "run"
    val = small_datasets_root / "lambda_det_shapes_v1" / "val"
    output = tmp_path / "predicted"
    argv = ["--config", "lambda_r26_shapes", "--input", val, "--output", output]
    argv += ["--confidence-threshold", "0.05", "--batch-size", "3"]
    status, err = predict_tool([*argv, "MODEL.WEIGHTS", trained / "model_final.pth"], capsys)
    assert status == 0, err[-3000:]
    predicted = json.loads((output / "predictions.json").read_text())
    evaluated = json.loads(
        (trained / "inference/lambda_det_shapes_val/coco_instances_results.json").read_text()
    )
    assert len(predicted) == len(evaluated) > 0
    predicted, evaluated = by_image(predicted), by_image(evaluated)
    assert predicted.keys() == evaluated.keys()
    for image_id, expected in evaluated.items():
        for ours, theirs in zip(predicted[image_id], expected):
            assert ours["category_id"] == theirs["category_id"]
            assert ours["score"] == pytest.approx(theirs["score"], abs=1e-4)
            assert ours["bbox"] == pytest.approx(theirs["bbox"], abs=1e-2)
            iou = mask_util.iou([ours["segmentation"]], [theirs["segmentation"]], [0])
            assert iou[0, 0] > 0.99
    assert len(list(output.glob("*.png"))) == len(list(val.glob("*.png")))
    # Scored with pycocotools, the file gives the evaluator's AP.
    ground_truth = COCO(str(small_datasets_root / "lambda_det_shapes_v1" / "val.json"))
    recorded = load_results(str(trained))
    for task in ("bbox", "segm"):
        evaluation = COCOeval(
            ground_truth, ground_truth.loadRes(str(output / "predictions.json")), task
        )
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
        assert evaluation.stats[0] * 100 == pytest.approx(recorded[task]["AP"], abs=1e-3)


@pytest.mark.slow
@pytest.mark.e2e
def test_videos_and_bad_inputs(evaluated_run, small_shapes, tmp_path, capsys):
    video = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 5, (96, 64))
    for value in (40, 120, 200):
        writer.write(np.full((64, 96, 3), value, np.uint8))
    writer.release()
    config = ["--config", "lambda_r26_shapes"]
    weights = ["MODEL.WEIGHTS", evaluated_run / "run/model_final.pth"]
    argv = [*config, "--input", video, "--output", tmp_path / "out", "--confidence-threshold"]
    status, err = predict_tool([*argv, "0.0", *weights], capsys)
    assert status == 0, err[-3000:]
    frames = {r["frame"] for r in json.loads((tmp_path / "out/predictions.json").read_text())}
    assert frames == {0, 1, 2}
    assert cv2.VideoCapture(str(tmp_path / "out/clip.mp4")).get(cv2.CAP_PROP_FRAME_COUNT) == 3

    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a picture")
    other = ["MODEL.LAMBDA_RESNET.DEPTH", "50"]
    cases = {
        "unreadable image": ([broken, *weights], "broken.png"),
        "missing input": ([tmp_path / "nowhere.jpg", *weights], "nowhere.jpg"),
        "missing weights": ([video, "MODEL.WEIGHTS", tmp_path / "none.pth"], "none.pth"),
        "other architecture": ([video, *weights, *other], "does not fit the model"),
        "results kept": ([video, *weights], "already holds predictions.json"),
    }
    for name, (arguments, fragment) in cases.items():
        inputs, overrides = arguments[:1], arguments[1:]
        output = tmp_path / ("out" if name == "results kept" else name.replace(" ", "_"))
        argv = [*config, "--input", *inputs, "--output", output, *overrides]
        assert_one_line_error(*predict_tool(argv, capsys), fragment)
