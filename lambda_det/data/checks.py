"""Checks on training data before a long run starts: bad input fails at once, with its name.

Detectron2 reports a missing image or a malformed annotation from inside a data-loader worker,
possibly hours into training; a missing dataset folder as a bare FileNotFoundError. These checks
run once, when the train loader is built.
"""
import difflib
import math
import numbers
import os
from typing import List, Sequence

from detectron2.data import DatasetCatalog, get_detection_dataset_dicts
from detectron2.structures import BoxMode

__all__ = ["load_checked_dataset_dicts", "check_dataset_dicts", "MISSING_DATASET_HINT"]

MISSING_DATASET_HINT = (
    "detectron2 reads its builtin datasets (coco_2017_train, ...) from $DETECTRON2_DATASETS, "
    "now {root!r}: set DETECTRON2_DATASETS to the folder that holds coco/ (with coco/annotations "
    "and coco/train2017), or register your own dataset")


def load_checked_dataset_dicts(names: Sequence[str], filter_empty: bool = True,
                               require_masks: bool = False) -> List[dict]:
    """``get_detection_dataset_dicts`` plus :func:`check_dataset_dicts` and clearer errors.

    Images without annotations are dropped by detectron2 when ``filter_empty`` (it logs how many).
    """
    registered = DatasetCatalog.list()
    for name in names:
        if name not in registered:
            close = difflib.get_close_matches(name, registered, n=3)
            raise KeyError(f"dataset {name!r} is not registered"
                           + (f"; did you mean {' or '.join(map(repr, close))}?" if close else
                              " (register it with detectron2's DatasetCatalog first)"))
    try:
        dicts = get_detection_dataset_dicts(list(names), filter_empty=filter_empty)
    except FileNotFoundError as error:
        root = os.getenv("DETECTRON2_DATASETS", "datasets")
        raise FileNotFoundError(f"{error}\n{MISSING_DATASET_HINT.format(root=root)}") from error
    except KeyError as error:
        raise ValueError(f"datasets {list(names)}: an annotation lacks the field {error}; "
                         f"COCO annotations need bbox, category_id (and segmentation for "
                         f"masks)") from error
    check_dataset_dicts(dicts, names, require_masks)
    return dicts


def check_dataset_dicts(dicts: Sequence[dict], names: Sequence[str] = (),
                        require_masks: bool = False) -> None:
    """Raise a ValueError / FileNotFoundError naming the first bad image or annotation."""
    where = f" (datasets {list(names)})" if names else ""
    for record in dicts:
        file_name = record.get("file_name")
        if not file_name:
            raise ValueError(f"image record {record.get('image_id')!r} has no file_name{where}")
        if not os.path.isfile(file_name):
            raise FileNotFoundError(f"image file {file_name} does not exist{where}")
        for annotation in record.get("annotations", []):
            required = ("bbox", "category_id") + (("segmentation",) if require_masks else ())
            for key in required:
                if key not in annotation:
                    raise ValueError(f"an annotation of {file_name} has no {key!r}{where}")
            box = list(annotation["bbox"])
            if len(box) != 4 or not all(isinstance(x, numbers.Real) and not isinstance(x, bool)
                                        and math.isfinite(x) for x in box):
                raise ValueError(f"an annotation of {file_name} has bbox={box}, not 4 finite "
                                 f"numbers{where}")
            mode = annotation.get("bbox_mode", BoxMode.XYWH_ABS)
            x0, y0, x1, y1 = BoxMode.convert(box, mode, BoxMode.XYXY_ABS)
            if x1 < x0 or y1 < y0:
                raise ValueError(f"an annotation of {file_name} has a box of negative size: "
                                 f"bbox={box} ({BoxMode(mode).name}){where}")
