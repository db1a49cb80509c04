"""tools/predict.py, tools/export_model.py and the demo's picture refuse a config whose classes
differ from the weights' or from DATASETS.TEST[0]'s, in one line that names both counts and the
fix: the run's own config.yaml."""

import importlib
import json
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
from conftest import overrides
from detectron2.modeling import build_model

from lambda_det.checkpoint import AtomicCheckpointer, load_weights
from lambda_det.checkpoint.checkpointer import _class_counts
from lambda_det.cli import demo, predict
from lambda_det.data import register_datasets
from lambda_det.data.checks import check_image_file, check_prediction_classes
from lambda_det.run_config import load_config

CONFIG = "configs/Demo/lambda_r26_shapes.yaml"  # 3 classes, DATASETS.TEST lambda_det_shapes_val
TINY = overrides(
    {
        "MODEL.DEVICE": "cpu",
        "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER": "0.25",
        "MODEL.LAMBDA_RESNET.SCOPE": "3",
        "MODEL.RPN.PRE_NMS_TOPK_TEST": "50",
        "MODEL.RPN.POST_NMS_TOPK_TEST": "20",
        "INPUT.MIN_SIZE_TEST": "64",
        "INPUT.MAX_SIZE_TEST": "96",
    }
)
TWO_CLASSES = ["MODEL.ROI_HEADS.NUM_CLASSES", "2"]


pytestmark = pytest.mark.usefixtures("one_torch_thread", "shapes")  # DATASETS.TEST: shapes_val


@pytest.fixture(scope="module")
def two_class_weights(tmp_path_factory) -> str:
    """A checkpoint of the tiny demo model trained (here: initialised) for 2 classes."""
    torch.manual_seed(0)
    model = build_model(load_config(CONFIG, TINY + TWO_CLASSES))
    folder = tmp_path_factory.mktemp("two_classes")
    AtomicCheckpointer(model, save_dir=str(folder)).save("model_final")
    return str(folder / "model_final.pth")


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "photo.png"
    picture = np.zeros((64, 96, 3), np.uint8)
    picture[10:40, 20:70] = (0, 0, 255)
    cv2.imwrite(str(path), picture)
    return path


def run_tool(name, argv, capsys) -> str:
    """The tool's single ``error:`` line (it must exit with status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(f"lambda_det.cli.{name}").main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
    return errors[0]


def predict_argv(image, output, *overrides):
    return ["--config", CONFIG, "--input", str(image), "--output", str(output), *TINY, *overrides]


def test_predict_refuses_weights_of_another_class_count(two_class_weights, image, tmp_path, capsys):
    error = run_tool(
        "predict", predict_argv(image, tmp_path / "out", "MODEL.WEIGHTS", two_class_weights), capsys
    )
    assert "trained for 2 classes" in error and "has 3" in error, error
    assert "cls_score.weight" in error and "config.yaml" in error
    assert not (tmp_path / "out").exists()


def test_predict_refuses_a_dataset_of_another_class_count(
    two_class_weights, image, tmp_path, capsys
):
    """The issue's case: 2-class weights fit with NUM_CLASSES 2, but the shipped config's
    dataset would name class 0 "circle"."""
    error = run_tool(
        "predict",
        predict_argv(image, tmp_path / "out", *TWO_CLASSES, "MODEL.WEIGHTS", two_class_weights),
        capsys,
    )
    assert "MODEL.ROI_HEADS.NUM_CLASSES is 2" in error and "has 3 categories" in error, error
    assert "lambda_det_shapes_val" in error and "OUTPUT_DIR/config.yaml" in error
    assert not (tmp_path / "out").exists()


def test_predict_refuses_an_unregistered_test_dataset(two_class_weights, image, tmp_path, capsys):
    error = run_tool(
        "predict",
        predict_argv(
            image,
            tmp_path / "out",
            *TWO_CLASSES,
            "DATASETS.TEST",
            "('lambda_det_shapes_vall',)",
            "MODEL.WEIGHTS",
            two_class_weights,
        ),
        capsys,
    )
    assert "'lambda_det_shapes_vall' is not registered" in error
    assert "did you mean 'lambda_det_shapes_val'" in error


@pytest.mark.parametrize("threshold", ["5", "-0.1", "nan"])
def test_predict_refuses_a_confidence_threshold_that_is_not_a_score(
    image, tmp_path, capsys, threshold
):
    error = run_tool(
        "predict",
        [
            "--config",
            CONFIG,
            "--input",
            str(image),
            "--output",
            str(tmp_path / "out"),
            "--confidence-threshold",
            threshold,
            *TINY,
        ],
        capsys,
    )
    assert error == (
        f"error: --confidence-threshold must be a score in [0, 1], got "
        f"{float(threshold)}: pass e.g. 0.5 (0.05 keeps what evaluation keeps)"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_predict_refuses_a_16_bit_image_as_the_dataset_checks_do(
    two_class_weights, image, tmp_path, capsys
):
    """detectron2's read_image reads a 16-bit grayscale PNG as solid white; predict refuses it
    in the dataset checks' words."""
    deep = tmp_path / "deep.png"
    cv2.imwrite(str(deep), np.full((64, 96), 40000, np.uint16))
    with pytest.raises(ValueError) as checked:
        check_image_file(str(deep))
    error = run_tool(
        "predict",
        predict_argv(
            deep,
            tmp_path / "out",
            *TWO_CLASSES,
            *two_class_dataset(tmp_path, image),
            "MODEL.WEIGHTS",
            two_class_weights,
        ),
        capsys,
    )
    assert str(checked.value) in error and error.startswith("error: 1 of 1 inputs cannot be read")
    assert "16-bit grayscale (PIL mode 'I;16')" in error


def two_class_dataset(folder, image) -> list:
    """Overrides that register a COCO dataset of 2 categories (its classes known only once its
    file is read) and make it DATASETS.TEST."""
    name = f"two_shapes_{folder.name}"
    annotations = folder / "two.json"
    annotations.write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": image.name, "height": 64, "width": 96}],
                "annotations": [
                    {
                        "id": 1,
                        "image_id": 1,
                        "category_id": 7,
                        "bbox": [20, 10, 50, 30],
                        "area": 1500,
                        "iscrowd": 0,
                    }
                ],
                "categories": [{"id": 7, "name": "disc"}, {"id": 9, "name": "block"}],
            }
        )
    )
    return [
        "DATASETS.COCO_INSTANCES",
        str([[name, str(annotations), str(image.parent)]]),
        "DATASETS.TEST",
        f"('{name}',)",
    ]


@pytest.mark.slow
@pytest.mark.e2e
def test_predict_with_the_runs_config_yaml(two_class_weights, image, tmp_path, capsys):
    """Positive control: the config.yaml a 2-class run saves (its dataset registered through
    DATASETS.COCO_INSTANCES) predicts, and names the user's classes."""
    run_config = tmp_path / "run" / "config.yaml"
    run_config.parent.mkdir()
    run_config.write_text(
        load_config(CONFIG, TINY + TWO_CLASSES + two_class_dataset(tmp_path, image)).dump()
    )
    status = predict.main(
        [
            "--config",
            str(run_config),
            "--input",
            str(image),
            "--output",
            str(tmp_path / "out"),
            "--confidence-threshold",
            "0",
            "MODEL.WEIGHTS",
            two_class_weights,
        ]
    )
    assert status == 0
    results = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert {result["category_id"] for result in results} <= {7, 9}
    assert (tmp_path / "out" / "photo.png").is_file()


def test_classes_read_from_the_annotation_file(image, tmp_path):
    cfg = load_config(CONFIG, TINY + two_class_dataset(tmp_path, image))
    register_datasets(cfg)  # as the tools do
    with pytest.raises(
        ValueError,
        match="NUM_CLASSES is 3, but dataset 'two_shapes.* has 2 "
        "categories: pass the run's own config",
    ):
        check_prediction_classes(cfg)
    check_prediction_classes(
        load_config(CONFIG, TINY + TWO_CLASSES + two_class_dataset(tmp_path, image))
    )


@pytest.mark.parametrize("case", ["weights", "dataset"])
def test_export_runs_the_same_checks(case, two_class_weights, tmp_path, capsys):
    overrides = TWO_CLASSES if case == "dataset" else []
    error = run_tool(
        "export_model",
        [
            "--config",
            CONFIG,
            "--format",
            "torchscript",
            "--output",
            str(tmp_path / "model.ts"),
            *TINY,
            *overrides,
            "MODEL.WEIGHTS",
            two_class_weights,
        ],
        capsys,
    )
    assert {
        "weights": "trained for 2 classes",
        "dataset": "NUM_CLASSES is 2, but dataset 'lambda_det_shapes_val'",
    }[case] in error
    assert not (tmp_path / "model.ts").exists()


@pytest.mark.parametrize("case", ["weights", "dataset"])
def test_the_demos_picture_runs_the_same_checks(case, two_class_weights, tmp_path):
    overrides = TWO_CLASSES if case == "dataset" else []
    cfg = load_config(CONFIG, TINY + overrides)
    expected = {
        "weights": "trained for 2 classes, but the model built from the config has 3",
        "dataset": "NUM_CLASSES is 2, but dataset 'lambda_det_shapes_val'",
    }[case]
    with pytest.raises(ValueError, match=expected):
        demo.draw_predictions(
            cfg, two_class_weights, "lambda_det_shapes_val", tmp_path / "predictions.png"
        )
    assert not (tmp_path / "predictions.png").exists()


def test_fine_tuning_may_change_the_class_count(two_class_weights):
    """Negative control: initial weights need only the backbone, so a new class count loads."""
    model = build_model(load_config(CONFIG, TINY))
    load_weights(model, two_class_weights, require="backbone")
    with pytest.raises(ValueError, match="trained for 2 classes"):
        load_weights(model, two_class_weights, require="all")


def test_class_counts_of_rcnn_and_retinanet_heads():
    rcnn = SimpleNamespace(roi_heads=SimpleNamespace(num_classes=3))
    assert _class_counts(rcnn, [("roi_heads.box_predictor.cls_score.weight", (81, 8), (4, 8))])[
        :2
    ] == (80, 3)
    retinanet = SimpleNamespace(num_classes=3)  # 9 anchors: 27 rows for 3 classes
    assert _class_counts(retinanet, [("head.cls_score.weight", (18, 8, 3, 3), (27, 8, 3, 3))])[
        :2
    ] == (2, 3)
    assert _class_counts(rcnn, [("roi_heads.mask_head.deconv.weight", (8, 8), (4, 8))]) is None
