"""COCO-format datasets with bad annotations, unregistered names or a missing folder are named;
unusual images (grayscale, RGBA, 1x1, odd sizes, none annotated) train and infer.
(From tests/test_reliability.py.)"""

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import tiny_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import register_coco_instances
from detectron2.modeling import build_model
from detectron2.utils.events import EventStorage

from lambda_det.data.checks import check_dataset_dicts, load_checked_dataset_dicts
from lambda_det.engine import Trainer


def write_coco(folder: Path, images, annotations) -> Path:
    path = folder / "instances.json"
    path.write_text(
        json.dumps(
            {
                "images": images,
                "annotations": annotations,
                "categories": [{"id": 1, "name": "thing"}],
            }
        )
    )
    return path


def register(name: str, json_path: Path, image_root: Path):
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    register_coco_instances(name, {}, str(json_path), str(image_root))


def square(x, y, size):
    return [[x, y, x + size, y, x + size, y + size, x, y + size]]


@pytest.mark.parametrize(
    "problem,error,message",
    [
        (
            "negative box",
            ValueError,
            r"a\.png\), annotation 1 of 1 has a box of negative size, "
            r"bbox=\[5, 5, -3, 4\]",
        ),
        (
            "infinite box",
            ValueError,
            r"a\.png\), annotation 1 of 1 has bbox=\[5, 5, inf, 4\], not 4 "
            r"finite numbers",
        ),
        ("missing bbox", ValueError, r"image id 1 \(.*a\.png\), annotation 1 of 1 has no 'bbox'"),
        ("missing image", FileNotFoundError, r"image file .*missing\.png does not exist"),
        ("missing segmentation", ValueError, r"a\.png\), annotation 1 of 1 has no 'segmentation'"),
    ],
)
def test_bad_coco_annotations_are_named(tmp_path, problem, error, message):
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((20, 20, 3), np.uint8))
    annotation = {
        "id": 1,
        "image_id": 1,
        "category_id": 1,
        "bbox": [5, 5, 6, 4],
        "area": 24,
        "iscrowd": 0,
        "segmentation": square(5, 5, 4),
    }
    image = {"id": 1, "file_name": "a.png", "height": 20, "width": 20}
    if problem == "negative box":
        annotation["bbox"] = [5, 5, -3, 4]
    elif problem == "infinite box":
        annotation["bbox"] = [5, 5, float("inf"), 4]
    elif problem == "missing bbox":
        del annotation["bbox"]
    elif problem == "missing image":
        image["file_name"] = "missing.png"
    elif problem == "missing segmentation":
        del annotation["segmentation"]
    register("lambda_det_test_bad_coco", write_coco(tmp_path, [image], [annotation]), tmp_path)
    with pytest.raises(error, match=message):
        load_checked_dataset_dicts(["lambda_det_test_bad_coco"], require_masks=True)


def test_numpy_boxes_pass_the_checks(tmp_path):
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((20, 20, 3), np.uint8))
    boxes = [np.array([1, 1, 3, 3], np.float32), [np.int64(1), 1, 3, 3]]
    check_dataset_dicts(
        [
            {
                "file_name": str(tmp_path / "a.png"),
                "annotations": [{"bbox": box, "category_id": 0} for box in boxes],
            }
        ]
    )


def test_unregistered_dataset_is_named_with_close_matches():
    with pytest.raises(
        KeyError,
        match="dataset 'coco_2017_trian' is not registered; did you mean 'coco_2017_train'",
    ):
        load_checked_dataset_dicts(["coco_2017_trian"])


def test_missing_dataset_folder_says_how_to_set_detectron2_datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("DETECTRON2_DATASETS", str(tmp_path / "nowhere"))
    register(
        "lambda_det_test_missing",
        tmp_path / "nowhere/coco/instances.json",
        tmp_path / "nowhere/coco",
    )
    with pytest.raises(FileNotFoundError, match="set DETECTRON2_DATASETS to the folder that holds"):
        load_checked_dataset_dicts(["lambda_det_test_missing"])


def test_unusual_images_train_and_infer(tmp_path):
    """Grayscale, RGBA, 1x1 and 17x31 images, and an image without annotations."""
    images, annotations = [], []
    for image_id, (name, array) in enumerate(
        [
            ("gray.png", np.full((40, 50), 90, np.uint8)),
            ("rgba.png", np.full((30, 40, 4), 200, np.uint8)),
            ("one.png", np.full((1, 1, 3), 10, np.uint8)),
            ("odd.png", np.full((17, 31, 3), 60, np.uint8)),
            ("empty.png", np.full((24, 24, 3), 30, np.uint8)),
        ],
        start=1,
    ):
        cv2.imwrite(str(tmp_path / name), array)
        height, width = array.shape[:2]
        images.append({"id": image_id, "file_name": name, "height": height, "width": width})
        size = 1 if name == "one.png" else 8
        if name != "empty.png":
            annotations.append(
                {
                    "id": image_id,
                    "image_id": image_id,
                    "category_id": 1,
                    "bbox": [0, 0, size, size],
                    "area": size * size,
                    "iscrowd": 0,
                    "segmentation": square(0, 0, size),
                }
            )
    register("lambda_det_test_unusual", write_coco(tmp_path, images, annotations), tmp_path)
    cfg = tiny_cfg(
        tmp_path / "out",
        **{
            "DATASETS.TRAIN": ("lambda_det_test_unusual",),
            "MODEL.ROI_HEADS.NUM_CLASSES": 1,
            "SOLVER.IMS_PER_BATCH": 4,
        },
    )
    loader = Trainer.build_train_loader(cfg)
    # The image without annotations is dropped (detectron2's FILTER_EMPTY_ANNOTATIONS, logged).
    assert sorted(Path(r["file_name"]).name for r in loader.dataset) == [
        "gray.png",
        "odd.png",
        "one.png",
        "rgba.png",
    ]
    batch = next(iter(loader))
    assert len(batch) == 4 and all(record["image"].shape == (3, 256, 256) for record in batch)
    model = build_model(cfg)
    with EventStorage():
        losses = model(batch)
    assert all(torch.isfinite(value) for value in losses.values())
    model.eval()
    with torch.no_grad():
        outputs = model(
            [
                {"image": torch.zeros(3, 1, 1, dtype=torch.uint8), "height": 1, "width": 1},
                {"image": torch.zeros(3, 17, 31, dtype=torch.uint8)},
            ]
        )
    assert outputs[0]["instances"].image_size == (1, 1)
