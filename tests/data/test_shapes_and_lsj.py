"""The large-scale jitter and the bundled shapes dataset."""

import json

import cv2
import numpy as np
import pytest
import torch
from conftest import CONFIGS
from detectron2.data import transforms as T

import lambda_det.data
import lambda_det.modeling
from lambda_det.data import build_lsj_augmentations, build_mapper
from lambda_det.data.shapes import SHAPES_CLASSES, generate_split


def load_config(relative: str):
    cfg = lambda_det.get_cfg()
    cfg.merge_from_file(str(CONFIGS / relative))
    return cfg


def test_lsj_crops_pads_and_recomputes_boxes(tmp_path):
    cfg = load_config("Demo/lambda_r26_shapes.yaml")
    cfg.INPUT.LSJ.IMAGE_SIZE = 64
    mapper = build_mapper(cfg, is_train=True)
    image = np.random.randint(0, 255, (50, 80, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "image.png"), image)
    polygon = [[10.0, 10.0, 40.0, 10.0, 40.0, 30.0, 10.0, 30.0]]
    record = {
        "file_name": str(tmp_path / "image.png"),
        "height": 50,
        "width": 80,
        "annotations": [
            {"bbox": [10, 10, 30, 20], "bbox_mode": 0, "category_id": 1, "segmentation": polygon}
        ],
    }
    sizes = set()
    for seed in range(6):
        np.random.seed(seed)
        out = mapper(dict(record, annotations=[dict(record["annotations"][0])]))
        assert tuple(out["image"].shape) == (3, 64, 64)
        instances = out["instances"]
        if len(instances):
            mask_box = instances.gt_masks.get_bounding_boxes().tensor
            assert torch.allclose(instances.gt_boxes.tensor, mask_box)
        sizes.add(int((out["image"] != 128).any(0).sum()))
    assert len(sizes) > 1  # different scales each time
    # Evaluation keeps detectron2's test resize, whatever LSJ.IMAGE_SIZE is.
    (test_resize,) = build_mapper(cfg, is_train=False).augmentations.augs
    assert isinstance(test_resize, T.ResizeShortestEdge)
    resized = test_resize.get_transform(np.zeros((480, 640, 3)))
    assert resized.new_w == cfg.INPUT.MAX_SIZE_TEST == 256
    with pytest.raises(ValueError, match="got 2.0 and 0.1"):
        build_lsj_augmentations(64, 2.0, 0.1)
    with pytest.raises(ValueError, match="LSJ is a training augmentation"):
        build_lsj_augmentations(1024, 0.1, 2.0, is_train=False)


def test_evaluation_at_another_size_than_training_is_logged(caplog):
    cfg = load_config("Demo/lambda_r26_shapes.yaml")
    with caplog.at_level("WARNING", logger="lambda_det.data.mapper"):
        build_mapper(cfg, is_train=False)
    assert not caplog.records  # the demo trains and evaluates at 256
    cfg.INPUT.LSJ.IMAGE_SIZE = 640
    with caplog.at_level("WARNING", logger="lambda_det.data.mapper"):
        build_mapper(cfg, is_train=False)
    assert "not at the training size INPUT.LSJ.IMAGE_SIZE = 640" in caplog.text


def test_shapes_registration_follows_detectron2_datasets_when_registered(tmp_path, monkeypatch):
    from detectron2.data import DatasetCatalog, MetadataCatalog

    from lambda_det.data import register_shapes_datasets

    # A complete (tiny) dataset folder under another DETECTRON2_DATASETS.
    root = tmp_path / "lambda_det_shapes_v1"
    (root / "val").mkdir(parents=True)
    cv2.imwrite(str(root / "val" / "1.png"), np.zeros((8, 8, 3), np.uint8))
    (root / "val.json").write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "1.png", "height": 8, "width": 8}],
                "annotations": [],
                "categories": [
                    {"id": i + 1, "name": name} for i, name in enumerate(SHAPES_CLASSES)
                ],
            }
        )
    )
    (root / "COMPLETE").write_text("v1")
    monkeypatch.setenv("DETECTRON2_DATASETS", str(tmp_path))
    register_shapes_datasets()
    metadata = MetadataCatalog.get("lambda_det_shapes_val")
    assert metadata.json_file == str(root / "val.json")  # what COCOEvaluator reads
    monkeypatch.setenv("DETECTRON2_DATASETS", str(tmp_path / "elsewhere"))  # after registration
    (record,) = DatasetCatalog.get("lambda_det_shapes_val")
    assert record["file_name"] == str(root / "val" / "1.png")  # the same folder
    monkeypatch.undo()
    register_shapes_datasets()
    assert not MetadataCatalog.get("lambda_det_shapes_val").json_file.startswith(str(tmp_path))
    stale = tmp_path / "stale"
    (stale / "leftover").mkdir(parents=True)
    # The refusal comes after the generation (into a staging folder): skip drawing 304 images.
    monkeypatch.setattr(lambda_det.data.shapes, "generate_split", lambda folder, split: folder)
    with pytest.raises(
        OSError,
        match=f"cannot create the shapes dataset at {stale}: the folder "
        f"exists but is not a complete dataset",
    ):
        lambda_det.data.ensure_shapes_dataset(stale)


@pytest.mark.slow
def test_shapes_dataset_is_deterministic_and_covers_every_size(tmp_path):
    first = json.loads(generate_split(tmp_path / "a", "val").read_text())
    second = json.loads(generate_split(tmp_path / "b", "val").read_text())
    assert first == second
    assert (tmp_path / "a/val/00001.png").read_bytes() == (
        tmp_path / "b/val/00001.png"
    ).read_bytes()
    areas = [a["area"] for a in first["annotations"]]
    buckets = {"small": sum(a < 32**2 for a in areas), "large": sum(a > 96**2 for a in areas)}
    buckets["medium"] = len(areas) - buckets["small"] - buckets["large"]
    assert min(buckets.values()) >= 20, buckets
    assert {c["name"] for c in first["categories"]} == set(SHAPES_CLASSES)
    assert {a["category_id"] for a in first["annotations"]} == {1, 2, 3}
