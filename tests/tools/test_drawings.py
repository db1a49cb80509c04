"""The pictures of predict and the demo say the score a detection needed, and say so when an
image had none (an empty picture is otherwise indistinguishable from a broken model)."""

import numpy as np
import torch
from detectron2.data import MetadataCatalog
from detectron2.structures import Boxes, Instances

from lambda_det.inference import draw

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
