"""What a run may read by name, registered in detectron2's ``DatasetCatalog`` by the tools and
the engine before they build loaders or check datasets: loading a config registers nothing."""

from typing import List

from lambda_det.data.coco import register_coco_datasets
from lambda_det.data.shapes import register_shapes_datasets

__all__ = ["register_datasets"]


def register_datasets(cfg=None) -> List[str]:
    """Register the bundled shapes datasets (:func:`register_shapes_datasets`) and, of a yaml
    config ``cfg``, the COCO-format datasets of ``DATASETS.COCO_INSTANCES``
    (:func:`register_coco_datasets`); returns the names of the latter. Idempotent.

    Raises:
        ValueError: a ``DATASETS.COCO_INSTANCES`` name is already registered with other files.
    """
    register_shapes_datasets()
    return [] if cfg is None else register_coco_datasets(cfg)
