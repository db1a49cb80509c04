"""The metadata written beside an exported file: how to feed the model and read its outputs,
the classes by dataset category id and name included."""

from typing import List

from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog

from lambda_det.data.mapper import build_mapper
from lambda_det.export.tracing import TracedModel
from lambda_det.inference import metadata_of


def class_table(metadata, num_classes: int) -> List[dict]:
    """For each class index of ``pred_classes``: the dataset's category ``id`` and ``name``.

    ``metadata``: the dataset's detectron2 metadata. Without ``thing_dataset_id_to_contiguous_id``
    the id is the index, and without ``thing_classes`` the name is None (as
    :func:`lambda_det.inference.coco_results` does).
    """
    to_dataset = {
        index: dataset_id
        for dataset_id, index in metadata.get("thing_dataset_id_to_contiguous_id", {}).items()
    }
    names = metadata.get("thing_classes", None) or []
    return [
        {
            "index": index,
            "id": to_dataset.get(index, index),
            "name": names[index] if index < len(names) else None,
        }
        for index in range(num_classes)
    ]


def _num_classes(cfg: CfgNode) -> int:
    if cfg.MODEL.META_ARCHITECTURE == "RetinaNet":
        return cfg.MODEL.RETINANET.NUM_CLASSES
    return cfg.MODEL.ROI_HEADS.NUM_CLASSES


def export_metadata(cfg: CfgNode, traced: TracedModel, format: str) -> dict:
    """What :func:`export_model` writes to :func:`metadata_path`: how to feed the exported
    model (input, test-time resize, dynamic sizes) and read it (outputs, classes of the test
    dataset ``DATASETS.TEST[0]``)."""
    dataset = cfg.DATASETS.TEST[0] if len(cfg.DATASETS.TEST) else None
    metadata = metadata_of(cfg)
    if (
        dataset in DatasetCatalog.list()
        and "thing_dataset_id_to_contiguous_id" not in metadata.as_dict()
    ):
        DatasetCatalog.get(dataset)  # detectron2's COCO loader sets the category ids
    smallest = (
        ""
        if traced.min_size is None
        else f" with H >= {traced.min_size[0]} and W >= {traced.min_size[1]}"
    )
    size_note = (
        f"any (3, H, W) image{smallest}: sizes are dynamic"
        if traced.dynamic_size
        else f"only (3, {traced.sample.shape[1]}, {traced.sample.shape[2]}) images: "
        f"{traced.fixed_size_reason}"
    )
    return {
        "format": format,
        **traced.metadata(),
        "input_format": cfg.INPUT.FORMAT,
        "input_note": (
            f"{size_note}; resize each image as the test loader does "
            f"(test_resize; lambda_det.export.sample_image) and give it in "
            f"input_format channel order"
        ),
        "test_resize": {
            "min_size": cfg.INPUT.MIN_SIZE_TEST,
            "max_size": cfg.INPUT.MAX_SIZE_TEST,
            "transform": repr(build_mapper(cfg, is_train=False).augmentations),
        },
        "dataset": dataset,
        "classes": class_table(metadata, _num_classes(cfg)),
    }
