"""tools/predict.py: predictions on image files, folders and videos, matching evaluation."""

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import REPO_ROOT, built_once, subprocess_env
from pycocotools import mask as mask_util
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from lambda_det.reports import load_results

TINY = [
    "MODEL.DEVICE",
    "cpu",
    "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER",
    "0.25",
    "MODEL.LAMBDA_RESNET.SCOPE",
    "3",
    "SOLVER.IMS_PER_BATCH",
    "2",
    "SOLVER.MAX_ITER",
    "3",
    "SOLVER.STEPS",
    "(2,)",
    "SOLVER.WARMUP_ITERS",
    "1",
    "DATALOADER.NUM_WORKERS",
    "0",
    "TEST.DETECTIONS_PER_IMAGE",
    "20",
]


def run_tool(script, *args, datasets_root):
    env = subprocess_env()
    env["DETECTRON2_DATASETS"] = str(datasets_root)
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / script), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=600,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory, datasets_root) -> Path:
    """A tiny run on the shapes dataset, evaluated on its validation split (once per run, also
    when pytest-xdist gives this module's tests to both workers)."""

    def train(output: Path):
        result = run_tool(
            "train_net.py",
            "--config",
            "lambda_r26_shapes",
            *TINY,
            "OUTPUT_DIR",
            output,
            datasets_root=datasets_root,
        )
        assert result.returncode == 0, result.stderr[-3000:]

    return built_once(tmp_path_factory, "test_predict-trained", train)


def by_image(results):
    grouped = {}
    for result in results:
        grouped.setdefault(result["image_id"], []).append(result)
    return {key: sorted(value, key=lambda r: -r["score"]) for key, value in grouped.items()}


@pytest.mark.slow
@pytest.mark.e2e
def test_predictions_match_the_evaluators(trained, datasets_root, tmp_path):
    val = datasets_root / "lambda_det_shapes_v1" / "val"
    output = tmp_path / "predicted"
    result = run_tool(
        "predict.py",
        "--config",
        "lambda_r26_shapes",
        "--input",
        val,
        "--output",
        output,
        "--confidence-threshold",
        "0.05",
        "--batch-size",
        "3",
        *TINY,
        "MODEL.WEIGHTS",
        trained / "model_final.pth",
        datasets_root=datasets_root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
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
    ground_truth = COCO(str(datasets_root / "lambda_det_shapes_v1" / "val.json"))
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
def test_videos_and_bad_inputs(trained, datasets_root, tmp_path):
    video = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 5, (96, 64))
    for value in (40, 120, 200):
        writer.write(np.full((64, 96, 3), value, np.uint8))
    writer.release()
    weights = ["MODEL.WEIGHTS", trained / "model_final.pth"]
    result = run_tool(
        "predict.py",
        "--config",
        "lambda_r26_shapes",
        "--input",
        video,
        "--output",
        tmp_path / "out",
        "--confidence-threshold",
        "0.0",
        *TINY,
        *weights,
        datasets_root=datasets_root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
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
        result = run_tool(
            "predict.py",
            "--config",
            "lambda_r26_shapes",
            "--input",
            *inputs,
            "--output",
            output,
            *TINY,
            *overrides,
            datasets_root=datasets_root,
        )
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert result.returncode == 2 and len(errors) == 1, (name, result.stderr[-2000:])
        assert fragment in errors[0] and "Traceback" not in result.stderr, name
