"""The bundled dataset: synthetic shapes in COCO format, generated on first use from a fixed seed.

Three classes (circle, square, triangle) of random colours on textured backgrounds. Each split
has many objects in every COCO size bucket (area < 32^2, 32^2..96^2, > 96^2; not every image has
all three), so APs, APm and APl are all defined. Objects do not overlap, so each mask is exactly
its polygon.

Registered in detectron2's catalogs as ``lambda_det_shapes_train`` (256 images) and
``lambda_det_shapes_val`` (48 images), under ``$DETECTRON2_DATASETS/lambda_det_shapes_v1``
(``./datasets`` by default, as detectron2's builtin datasets).
"""

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

import cv2
import numpy as np
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import load_coco_json
from pycocotools import mask as mask_util

__all__ = [
    "SHAPES_CLASSES",
    "SHAPES_SPLITS",
    "shapes_root",
    "ensure_shapes_dataset",
    "register_shapes_datasets",
    "generate_split",
]

SHAPES_CLASSES = ("circle", "square", "triangle")
VERSION = "v1"
IMAGE_SIZE = (256, 256)  # height, width
# split name: (number of images, seed)
SHAPES_SPLITS: Dict[str, Tuple[int, int]] = {"train": (256, 1), "val": (48, 2)}
# Side lengths per COCO size bucket; the polygon area lands inside the bucket for every class.
# (circle areas are pi/4 * side^2: 113..452, 1520..5027, 9503..15394)
SIDES = {"small": (12, 24), "medium": (44, 80), "large": (110, 140)}
# COCO category id -> contiguous class index (what load_coco_json derives from the files).
CATEGORY_IDS = {index + 1: index for index in range(len(SHAPES_CLASSES))}


def shapes_root() -> Path:
    return Path(os.getenv("DETECTRON2_DATASETS", "datasets")) / f"lambda_det_shapes_{VERSION}"


def _polygon(kind: str, center: Tuple[float, float], side: float, angle: float) -> np.ndarray:
    """Vertices (N, 2) in pixels: a circle of diameter ``side``, or a square or equilateral
    triangle of area ``side**2``, rotated by ``angle``."""
    if kind == "circle":
        radius, count = side / 2, 32
    elif kind == "square":
        radius, count = side / math.sqrt(2), 4
    else:
        radius, count = side * math.sqrt(4 / (3 * math.sqrt(3))), 3
    angles = angle + np.arange(count) * 2 * math.pi / count
    return np.stack([center[0] + radius * np.cos(angles), center[1] + radius * np.sin(angles)], 1)


def _background(rng: np.random.Generator) -> np.ndarray:
    height, width = IMAGE_SIZE
    low = rng.integers(0, 120, size=3)
    high = rng.integers(120, 256, size=3)
    ramp = np.linspace(0, 1, width)[None, :, None]
    image = low + (high - low) * ramp * np.ones((height, 1, 1))
    image += rng.normal(0, 12, size=(height, width, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def _make_image(rng: np.random.Generator) -> Tuple[np.ndarray, List[dict]]:
    image = _background(rng)
    height, width = IMAGE_SIZE
    objects, boxes = [], []
    buckets = ["large", "medium", "medium", "small", "small", "small"]
    for bucket in buckets[: rng.integers(3, len(buckets) + 1)]:
        for _ in range(50):  # rejection sampling for a free spot
            side = rng.uniform(*SIDES[bucket])
            kind_index = int(rng.integers(len(SHAPES_CLASSES)))
            margin = side * 0.8
            center = (rng.uniform(margin, width - margin), rng.uniform(margin, height - margin))
            polygon = _polygon(
                SHAPES_CLASSES[kind_index], center, side, rng.uniform(0, 2 * math.pi)
            )
            x0, y0 = polygon.min(0) - 2
            x1, y1 = polygon.max(0) + 2
            if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
                continue
            if any(x0 < bx1 and bx0 < x1 and y0 < by1 and by0 < y1 for bx0, by0, bx1, by1 in boxes):
                continue
            boxes.append((x0, y0, x1, y1))
            color = tuple(int(c) for c in rng.integers(0, 256, size=3))
            cv2.fillPoly(image, [np.round(polygon).astype(np.int32)], color, lineType=cv2.LINE_8)
            objects.append({"category": kind_index, "polygon": polygon})
            break
    return image, objects


def generate_split(folder: Path, split: str) -> Path:
    """Write ``folder/<split>/*.png`` and ``folder/<split>.json``; returns the JSON path."""
    count, seed = SHAPES_SPLITS[split]
    rng = np.random.default_rng(seed)
    image_dir = folder / split
    image_dir.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    height, width = IMAGE_SIZE
    for image_id in range(1, count + 1):
        image, objects = _make_image(rng)
        file_name = f"{image_id:05d}.png"
        cv2.imwrite(str(image_dir / file_name), image)
        images.append({"id": image_id, "file_name": file_name, "height": height, "width": width})
        for obj in objects:
            flat = [float(round(v, 2)) for v in obj["polygon"].reshape(-1)]
            rle = mask_util.merge(mask_util.frPyObjects([flat], height, width))
            x, y, w, h = (float(v) for v in mask_util.toBbox(rle))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": obj["category"] + 1,
                    "segmentation": [flat],
                    "area": float(mask_util.area(rle)),
                    "bbox": [x, y, w, h],
                    "iscrowd": 0,
                }
            )
    categories = [{"id": i + 1, "name": name} for i, name in enumerate(SHAPES_CLASSES)]
    json_path = folder / f"{split}.json"
    json_path.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return json_path


def ensure_shapes_dataset(root: Path = None) -> Path:
    """Generate the dataset once (atomically: a half-written folder is never used); returns root."""
    root = Path(root or shapes_root())
    if (root / "COMPLETE").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".lambda_det_shapes_", dir=root.parent))
    try:
        for split in SHAPES_SPLITS:
            generate_split(staging, split)
        (staging / "COMPLETE").write_text(VERSION)
        try:
            staging.rename(root)
        except OSError as error:  # another process finished first, or a stale folder is there
            if not (root / "COMPLETE").is_file():
                if not root.is_dir():
                    raise
                raise OSError(
                    f"cannot create the shapes dataset at {root}: the folder exists "
                    f"but is not a complete dataset (no COMPLETE file); delete it "
                    f"and run again ({error})"
                ) from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def _load(split: str, name: str, root: Path) -> List[dict]:
    ensure_shapes_dataset(root)
    return load_coco_json(str(root / f"{split}.json"), str(root / split), name)


def register_shapes_datasets() -> None:
    """Register ``lambda_det_shapes_{train,val}``; the files are generated when first loaded.

    The folder is fixed here, from ``$DETECTRON2_DATASETS`` at registration (as detectron2's
    builtin datasets are), so the images that are loaded and the json_file that COCOEvaluator
    reads are always the same files. Calling it again after DETECTRON2_DATASETS changed moves
    the registration to the new folder.
    """
    root = shapes_root()
    for split in SHAPES_SPLITS:
        name = f"lambda_det_shapes_{split}"
        if name in DatasetCatalog.list():
            if MetadataCatalog.get(name).get("image_root") == str(root / split):
                continue
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
        DatasetCatalog.register(name, lambda split=split, name=name: _load(split, name, root))
        MetadataCatalog.get(name).set(  # the category ids too, as detectron2's builtin COCO
            thing_classes=list(SHAPES_CLASSES),
            thing_dataset_id_to_contiguous_id=CATEGORY_IDS,
            evaluator_type="coco",
            json_file=str(root / f"{split}.json"),
            image_root=str(root / split),
        )
