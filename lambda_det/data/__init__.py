"""Data: the large-scale-jitter mapper, the bundled synthetic shapes dataset, COCO-format
datasets named in the config (``DATASETS.COCO_INSTANCES``) and the checks run before training.
Importing it registers no dataset: :func:`register_datasets` does, called by the tools."""

from lambda_det.compat import import_detectron2

import_detectron2()  # quietly, and with a helpful error when it is missing

from lambda_det.data.catalog import register_datasets
from lambda_det.data.coco import register_coco_datasets
from lambda_det.data.mapper import DatasetMapper, build_lsj_augmentations, build_mapper
from lambda_det.data.shapes import (
    SHAPES_CLASSES,
    ensure_shapes_dataset,
    register_shapes_datasets,
    shapes_root,
)

__all__ = [
    "build_lsj_augmentations",
    "build_mapper",
    "DatasetMapper",
    "register_datasets",
    "register_coco_datasets",
    "SHAPES_CLASSES",
    "ensure_shapes_dataset",
    "register_shapes_datasets",
    "shapes_root",
]
