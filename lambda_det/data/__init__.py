"""Data: the large-scale-jitter mapper and the bundled synthetic shapes dataset."""
from lambda_det.data.mapper import build_lsj_augmentations, build_mapper
from lambda_det.data.shapes import (
    SHAPES_CLASSES, ensure_shapes_dataset, register_shapes_datasets, shapes_root)

register_shapes_datasets()

__all__ = ["build_lsj_augmentations", "build_mapper", "SHAPES_CLASSES", "ensure_shapes_dataset",
           "register_shapes_datasets", "shapes_root"]
