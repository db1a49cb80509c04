"""COCO-format datasets named in the config or on the command line, no Python needed.

``DATASETS.COCO_INSTANCES`` lists ``[name, json_file, image_root]`` triples; tools/train_net.py's
``--coco-dataset NAME JSON IMAGE_DIR`` (repeatable) adds to it; tools/lazyconfig_train_net.py
registers its ``--coco-dataset`` triples in every process. :func:`register_coco_datasets`
registers each with detectron2's own ``register_coco_instances``; the tools call it (through
:func:`lambda_det.data.register_datasets`) in every process of a run, whose config (dumped to
OUTPUT_DIR) keeps the list.
"""

import os
from typing import List, Sequence

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import register_coco_instances

from lambda_det.utils.errors import UserError

__all__ = ["register_coco_datasets", "register_coco_triples", "coco_dataset_overrides"]

KEY = "DATASETS.COCO_INSTANCES"


def _same_path(a, b) -> bool:
    return a is not None and os.path.abspath(os.path.expanduser(str(a))) == os.path.abspath(
        os.path.expanduser(str(b))
    )


def _triple(entry, source: str) -> List[str]:
    if (
        not isinstance(entry, (list, tuple))
        or len(entry) != 3
        or not all(isinstance(part, str) and part for part in entry)
    ):
        raise UserError(
            f"{source} entries are [name, json_file, image_root] (three non-empty "
            f"strings), got {entry!r}"
        )
    name, json_file, image_root = entry
    return [name, os.path.expanduser(json_file), os.path.expanduser(image_root)]


def register_coco_datasets(cfg) -> List[str]:
    """Register every ``[name, json_file, image_root]`` of ``cfg.DATASETS.COCO_INSTANCES``
    (:func:`register_coco_triples`); returns the names."""
    return register_coco_triples(cfg.DATASETS.get("COCO_INSTANCES", ()))


def register_coco_triples(entries: Sequence, source: str = KEY) -> List[str]:
    """Register each ``[name, json_file, image_root]`` with detectron2's
    ``register_coco_instances``; returns the names. Idempotent: a name already registered with
    the same files is left as it is. Files are read when the dataset is first loaded, as for
    detectron2's builtin datasets.

    Raises:
        ValueError: an entry is not three strings, or a name is already registered with other
            files (another entry, detectron2's builtin datasets, or the user's code); the
            message names ``source``, where the entries came from.
    """
    names = []
    for entry in entries:
        name, json_file, image_root = _triple(entry, source)
        if name in DatasetCatalog.list():
            metadata = MetadataCatalog.get(name)
            registered = (metadata.get("json_file"), metadata.get("image_root"))
            if not (_same_path(registered[0], json_file) and _same_path(registered[1], image_root)):
                raise UserError(
                    f"dataset name {name!r} ({source}) is already registered with annotation file "
                    f"{registered[0]} and images {registered[1]}, not {json_file} and "
                    f"{image_root}: give this dataset another name"
                )
        else:
            register_coco_instances(name, {}, json_file, image_root)
        names.append(name)
    return names


def coco_dataset_overrides(configured: Sequence, added: Sequence[Sequence[str]]) -> List[str]:
    """The ``KEY VALUE`` override that appends ``added`` triples (``--coco-dataset`` flags) to
    the ``configured`` ones (the config's ``DATASETS.COCO_INSTANCES``)."""
    triples = [list(entry) for entry in configured] + [list(entry) for entry in added]
    return [KEY, repr(triples)]
