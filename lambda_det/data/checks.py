"""Checks on the data of a run before it starts: bad input fails at once, with its name.

Detectron2 reports an annotation file that is not JSON as a bare ``JSONDecodeError``, an unknown
category id without the file, a missing or corrupt image from inside a data-loader worker
(possibly hours into training) and a dataset with nothing to learn from as an assertion; it
reads a COCO file with a repeated image id, short polygons or annotations of unknown images, and
a 16-bit grayscale image, wrongly without a word, and evaluates a NaN polygon until memory runs
out and a test set without annotations as AP nan. tools/predict.py reads its images through the
same check (:func:`read_checked_image`).
These checks run once, before training: :func:`check_run_datasets` is the pre-flight of both
training tools (tools/check_dataset.py's too), :func:`load_training_dicts` is what the trainer's
loader trains on. They take the values they check (:class:`DataSettings`, with the keys that set
them), read from a yaml config by :func:`yaml_data_settings` and from a LazyConfig recipe by
:func:`lambda_det.engine.run_settings.lazy_run_settings`.

Images are checked from their headers and tails (``DATALOADER.CHECK_IMAGES "header"``, see
:func:`check_image_file`) in a thread pool: COCO train2017's 118k images in about 15 s on 2 cores
from a warm page cache (docs/benchmarks.md).
"""

import difflib
import itertools
import json
import math
import numbers
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from detectron2.data import DatasetCatalog, MetadataCatalog, detection_utils
from detectron2.data.build import (
    check_metadata_consistency,
    filter_images_with_only_crowd_annotations,
    print_instances_class_histogram,
)
from detectron2.structures import BoxMode
from detectron2.utils.file_io import PathManager
from PIL import Image

from lambda_det.utils.errors import MissingFileError, UserError, UserKeyError
from lambda_det.utils.run_defaults import CHECK_IMAGES
from lambda_det.utils.setting import Setting, is_integer, override, shown

__all__ = [
    "DataSettings",
    "yaml_data_settings",
    "yaml_num_classes",
    "load_checked_dataset_dicts",
    "load_training_dicts",
    "load_checked_test_dicts",
    "load_dataset",
    "check_dataset_dicts",
    "check_annotation_file",
    "check_annotation_files",
    "segmentation_problem",
    "check_usable_annotations",
    "read_checked_image",
    "check_num_classes",
    "check_images",
    "check_image_file",
    "check_image_mode",
    "check_run_datasets",
    "CheckedSet",
    "check_prediction_classes",
    "IMAGE_CHECKS",
    "READABLE_IMAGE_MODES",
    "MISSING_DATASET_HINT",
    "RUN_CONFIG_FIX",
]

MISSING_DATASET_HINT = (
    "detectron2 reads its builtin datasets (coco_2017_train, ...) from $DETECTRON2_DATASETS, "
    "now {root!r}: set DETECTRON2_DATASETS to the folder that holds coco/ (with coco/annotations "
    "and coco/train2017), or register your own dataset"
)

# The fix of a config that does not match the run that trained the weights.
RUN_CONFIG_FIX = (
    "pass the run's own config, its OUTPUT_DIR/config.yaml, as --config (it holds "
    "the run's classes and datasets)"
)
# DATALOADER.CHECK_IMAGES: what the pre-flight reads of every image.
IMAGE_CHECKS = ("header", "full", "none")
# Bytes read from a file's end to find its end marker: encoders may pad after it.
_TAIL_BYTES = 1024
_END_MARKERS = {
    "JPEG": (b"\xff\xd9", "JPEG end-of-image marker FFD9"),
    "PNG": (b"IEND", "PNG IEND chunk"),
}
_EXIF_ORIENTATION = 274
# PIL modes that detectron2's read_image turns into what the image shows, 8 bits per channel
# (alpha dropped). It converts the others with PIL's ``convert``, which clips high-bit-depth
# grayscale to 0-255 instead of scaling it: a 16-bit image reads as solid white, a float one
# in [0, 1] as black. tests/data/test_dataset_checks.py reads each mode.
READABLE_IMAGE_MODES = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr")
_HIGH_BIT_DEPTH_MODES = {"I": "32-bit integer grayscale", "F": "32-bit float grayscale"}
# Architectures whose heads classify detectron2's thing classes, and the key of their count.
_NUM_CLASSES_KEYS = {
    "GeneralizedRCNN": "MODEL.ROI_HEADS.NUM_CLASSES",
    "PanopticFPN": "MODEL.ROI_HEADS.NUM_CLASSES",
    "RetinaNet": "MODEL.RETINANET.NUM_CLASSES",
}


class DataSettings(NamedTuple):
    """What a run reads of its data, each value with the key that sets it."""

    train: Setting  # the training datasets' names
    test: Setting  # the test datasets' names
    filter_empty: bool  # drop training images without usable annotations
    masks: bool  # the model predicts masks: annotations need segmentations
    num_classes: Optional[Setting]  # the model's class count (None: nothing to compare)
    check_images: Setting  # IMAGE_CHECKS: what the pre-flight reads of each image
    image_format: str  # the channel order images are read in


def yaml_num_classes(cfg) -> Optional[Setting]:
    """The class count of a yaml config's model (None for an architecture without one)."""
    key = _NUM_CLASSES_KEYS.get(cfg.MODEL.META_ARCHITECTURE)
    if key is None:
        return None
    node = cfg
    for part in key.split("."):
        node = node[part]
    return Setting(key, node)


def yaml_data_settings(cfg) -> DataSettings:
    """The data settings of a yaml config (tools/train_net.py)."""
    return DataSettings(
        train=Setting("DATASETS.TRAIN", tuple(cfg.DATASETS.TRAIN)),
        test=Setting("DATASETS.TEST", tuple(cfg.DATASETS.TEST)),
        filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS,
        masks=cfg.MODEL.MASK_ON,
        num_classes=yaml_num_classes(cfg),
        check_images=Setting(
            "DATALOADER.CHECK_IMAGES", cfg.DATALOADER.get("CHECK_IMAGES", CHECK_IMAGES)
        ),
        image_format=cfg.INPUT.FORMAT,
    )


def _describe(name: str) -> str:
    json_file = (
        MetadataCatalog.get(name).get("json_file") if name in DatasetCatalog.list() else None
    )
    return f"dataset {name!r}" + (f" (annotation file {json_file})" if json_file else "")


def _check_registered(names: Sequence[str]) -> None:
    registered = DatasetCatalog.list()
    for name in names:
        if name not in registered:
            close = difflib.get_close_matches(name, registered, n=3)
            raise UserKeyError(
                f"dataset {name!r} is not registered"
                + (
                    f"; did you mean {' or '.join(map(repr, close))}?"
                    if close
                    else " (register it with detectron2's DatasetCatalog, or name its "
                    "files with DATASETS.COCO_INSTANCES / --coco-dataset)"
                )
            )


def load_dataset(name: str) -> List[dict]:
    """``DatasetCatalog.get(name)``, with one-line errors that name the annotation file.

    Raises:
        KeyError: ``name`` is not registered.
        ValueError: the annotation file is not valid JSON (with the line and column), has no
            categories, an annotation has a category_id that is not among them, a record lacks
            a field, or detectron2's loader rejects the file; the dataset has no images.
        FileNotFoundError: the annotation file does not exist.
    """
    _check_registered([name])
    json_file = MetadataCatalog.get(name).get("json_file")
    where = _describe(name)
    try:
        dicts = DatasetCatalog.get(name)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        what = (
            f"annotation file {json_file} (dataset {name!r})"
            if json_file
            else f"a JSON file of dataset {name!r}"
        )
        problem = (
            str(error)
            if isinstance(error, json.JSONDecodeError)
            else f"byte {error.start} is not UTF-8 text"
        )
        raise UserError(
            f"{what} is not valid JSON ({problem}): fix the file or write it again"
        ) from None
    except FileNotFoundError as error:
        root = os.getenv("DETECTRON2_DATASETS", "datasets")
        builtin = json_file and os.path.abspath(json_file).startswith(
            os.path.abspath(root) + os.sep
        )
        hint = (
            MISSING_DATASET_HINT.format(root=root)
            if builtin or not json_file
            else ("check the path it was registered with (DATASETS.COCO_INSTANCES, --coco-dataset)")
        )
        raise MissingFileError(f"{where}: {error}; {hint}") from None
    except KeyError as error:
        # The file's data says what detectron2's loader met (e.g. an unknown category_id).
        check_annotation_file(name)
        raise UserError(
            f"{where}: an image or annotation lacks the field {error}; COCO images "
            f"need id, file_name, height, width and annotations image_id, bbox, "
            f"category_id (and segmentation for masks)"
        ) from None
    except (AssertionError, ValueError) as error:  # pycocotools' and detectron2's checks
        if (
            isinstance(error, ValueError)  # load_coco_json's min() of no category ids
            and MetadataCatalog.get(name).get("thing_classes") == []
        ):
            raise UserError(
                f'{where} has no categories: list them under "categories" (id and name each)'
            ) from None
        check_annotation_file(name)  # names the id, when the file's data shows what it is
        raise UserError(f"{where}: {' '.join(str(error).split())}") from None
    if not len(dicts):
        raise UserError(f'{where} has no images: check that the file lists them under "images"')
    return dicts


def _is_finite_number(value) -> bool:
    try:
        return (
            isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        )
    except OverflowError:  # an int too large for a float
        return False


def segmentation_problem(
    segmentation, height: Optional[int] = None, width: Optional[int] = None
) -> Optional[str]:
    """What is wrong with an annotation's ``segmentation``, in words (None: nothing): polygons
    of 3 or more x, y pairs of finite numbers (detectron2 drops shorter or odd ones without a
    word, trains on a NaN one as nothing and evaluates it until memory runs out), or an RLE mask
    of the image's ``height`` x ``width`` (when known). Cheap for COCO-size sets: a polygon's
    values are summed in C, and read one by one only when the sum is not finite."""
    if isinstance(segmentation, dict):
        size = segmentation.get("size")
        if height is not None and width is not None and list(size or ()) != [height, width]:
            return (
                f"an RLE mask of size {size} (height, width), not its image's [{height}, {width}]"
            )
        return None
    if not isinstance(segmentation, (list, tuple)):
        return (
            f"a segmentation of type {type(segmentation).__name__}, neither a list of "
            f"polygons nor an RLE mask"
        )
    for polygon in segmentation:
        if not isinstance(polygon, (list, tuple)):
            return f"a polygon {polygon!r} that is not a list of x, y values"
        if len(polygon) < 6 or len(polygon) % 2:
            return (
                f"a polygon of {len(polygon)} values, not 3 or more x, y pairs (an even "
                f"number, 6 or more)"
            )
        try:
            finite = math.isfinite(sum(polygon))
        except (TypeError, OverflowError):
            finite = False
        if not finite:  # an inf or NaN, a non-number, or finite values of an infinite sum
            bad = [value for value in polygon if not _is_finite_number(value)]
            if bad:
                return f"a polygon with the value {bad[0]!r}, not a finite number"
    return None


def check_annotation_file(name: str) -> Optional[bool]:
    """The COCO annotation file of dataset ``name`` as written, for what detectron2's loader
    hides or reads wrongly: images, annotations and categories with ids of their own
    (pycocotools indexes them by id and keeps the last entry of a repeated one: an image id
    given twice puts both images' boxes on one of them, and the other image is never seen),
    integer image ids, annotations of images the file lists (detectron2 drops the others), and
    sound segmentations (:func:`segmentation_problem`; detectron2 drops short polygons). Reads
    the file once more (about as long as detectron2's loading): the pre-flight calls this,
    training does not.

    Returns:
        whether the file lists "annotations" (COCO evaluation evaluates only then); None for a
        dataset without a COCO annotation file (nothing is checked).

    Raises:
        ValueError: naming the file, the id (image, annotation) and the fix.
    """
    json_file = MetadataCatalog.get(name).get("json_file")
    if not json_file:
        return None
    with PathManager.open(json_file) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        return None
    where = _describe(name)
    kinds = (
        ("images", "image", "file_name"),
        ("annotations", "annotation", "image_id"),
        ("categories", "category", "name"),
    )
    for key, kind, label in kinds:
        first_with_id = {}
        for entry in data.get(key) or ():
            if not isinstance(entry, dict) or "id" not in entry:
                continue
            first = first_with_id.setdefault(entry["id"], entry)
            if first is not entry:
                what = "annotations of image ids" if kind == "annotation" else key
                raise UserError(
                    f"{where}: {kind} id {entry['id']!r} is used twice, by {what} "
                    f"{first.get(label)!r} and {entry.get(label)!r}: give each {kind} its "
                    f"own id (pycocotools keeps only one of them)"
                )
    categories = sorted(
        entry["id"]
        for entry in data.get("categories") or ()
        if isinstance(entry, dict) and is_integer(entry.get("id"))
    )
    images = {}
    for image in data.get("images") or ():
        if isinstance(image, dict) and "id" in image:
            if not is_integer(image["id"]):
                raise UserError(
                    f"{where}: image {image.get('file_name')!r} has id "
                    f"{image['id']!r}, not an integer: give each image an integer "
                    f"id (COCO's format), and its annotations that image_id"
                )
            images[image["id"]] = image
    for annotation in data.get("annotations") or ():
        if not isinstance(annotation, dict):
            continue
        image = images.get(annotation.get("image_id"))
        if image is None:
            raise UserError(
                f"{where}: annotation id {annotation.get('id')!r} has image_id "
                f"{annotation.get('image_id')!r}, which no image of the file has "
                f"(detectron2 drops such annotations): set it to the id of its "
                f"image, or remove the annotation"
            )
        if categories and annotation.get("category_id") not in categories:
            raise UserError(
                f"{where}: an annotation has category_id={annotation.get('category_id')}, "
                f"which is not among the ids of the file's categories {categories}: fix the "
                f"annotation or add the category"
            )
        segmentation = annotation.get("segmentation")
        problem = (
            segmentation_problem(segmentation, image.get("height"), image.get("width"))
            if segmentation
            else None
        )
        if problem:
            raise UserError(
                f"{where}: annotation id {annotation.get('id')!r} of image id "
                f"{image['id']!r} ({image.get('file_name')}) has {problem}: fix "
                f"or remove the annotation"
            )
    return isinstance(data.get("annotations"), list)


def check_annotation_files(names: Sequence[str]) -> None:
    """:func:`check_annotation_file` of each dataset."""
    for name in names:
        check_annotation_file(name)


def load_training_dicts(
    data: DataSettings, check_files: bool = False, dropped: Optional[Dict[str, int]] = None
) -> List[dict]:
    """The training set as the trainer trains on it: the one place that says what training
    requires of its datasets (:func:`load_checked_dataset_dicts` with ``filter_empty``, and
    segmentations when the model predicts masks), for the trainer, the pre-flight and
    tools/check_dataset.py (these two with ``check_files``)."""
    return load_checked_dataset_dicts(
        data.train.value,
        filter_empty=data.filter_empty,
        require_masks=data.masks,
        check_files=check_files,
        dropped=dropped,
    )


def load_checked_test_dicts(
    name: str, require_masks: bool = False, key: str = "DATASETS.TEST"
) -> List[dict]:
    """A test set (of the list ``key``), loaded (:func:`load_dataset`), its COCO file checked
    (:func:`check_annotation_file`), its records checked as a training set's are
    (:func:`check_dataset_dicts`: sound boxes and segmentations, and segmentations when masks
    are evaluated), with an annotation to evaluate against (:func:`check_usable_annotations`)
    unless its file lists none, as COCO test-dev's (detectron2 then only writes the
    predictions): COCO evaluation accepts a NaN box, reports AP nan without annotations, and
    fails on a missing segmentation only after inference."""
    dicts = load_dataset(name)
    listed = check_annotation_file(name)
    check_dataset_dicts(dicts, [name], require_masks)
    if listed is not False and "annotations" in dicts[0]:
        check_usable_annotations([dicts], [name], test_key=key)
    return dicts


def load_checked_dataset_dicts(
    names: Sequence[str],
    filter_empty: bool = True,
    require_masks: bool = False,
    check_files: bool = False,
    dropped: Optional[Dict[str, int]] = None,
) -> List[dict]:
    """``get_detection_dataset_dicts(names, filter_empty)`` (the same records, in the same order),
    with clearer errors: :func:`load_dataset`, :func:`check_annotation_files` (with
    ``check_files``), :func:`check_usable_annotations` and :func:`check_dataset_dicts`. Images
    without usable annotations are dropped by detectron2 when ``filter_empty`` (it logs how
    many); ``dropped``, when given, gets their number by reason."""
    _check_registered(names)
    per_dataset = [load_dataset(name) for name in names]
    if check_files:
        check_annotation_files(names)
    dicts = list(itertools.chain.from_iterable(per_dataset))
    if "annotations" not in dicts[0]:  # not an instance dataset: nothing more to check
        return dicts
    check_usable_annotations(per_dataset, names)
    if filter_empty:
        for reason in map(_unusable, dicts):
            if reason is not None and dropped is not None:
                dropped[reason] = dropped.get(reason, 0) + 1
        per_dataset = [filter_images_with_only_crowd_annotations(part) for part in per_dataset]
        dicts = list(itertools.chain.from_iterable(per_dataset))
    try:
        class_names = MetadataCatalog.get(names[0]).thing_classes
    except AttributeError:  # class names are not available for this dataset
        pass
    else:
        check_metadata_consistency("thing_classes", names)
        # Into the run's log, as detectron2's loader logs it: detectron2 logs a message once
        # per process, and the checks before launch (check_files) run before the log exists.
        if not check_files:
            print_instances_class_histogram(dicts, class_names)
    for name, part in zip(names, per_dataset):  # each bad record named with its dataset
        check_dataset_dicts(part, [name], require_masks)
    return dicts


def _unusable(record: dict) -> Optional[str]:
    """Why detectron2's ``filter_empty`` drops the image of ``record`` (None: it keeps it)."""
    annotations = record.get("annotations", [])
    if not annotations:
        return "without annotations"
    if all(annotation.get("iscrowd", 0) for annotation in annotations):
        return "with only crowd annotations"
    return None


def check_usable_annotations(
    per_dataset: Sequence[Sequence[dict]], names: Sequence[str], test_key: Optional[str] = None
) -> None:
    """At least one non-crowd annotation to train on (to evaluate against, for a test set of
    the list ``test_key``), else a ValueError that says why."""
    counts = {"images": 0, "without annotations": 0, "with only crowd annotations": 0}
    for dicts in per_dataset:
        for record in dicts:
            counts["images"] += 1
            unusable = _unusable(record)
            if unusable is None:
                return
            counts[unusable] += 1
    where = ", ".join(_describe(name) for name in names)
    reasons = [f"{count} {kind}" for kind, count in counts.items() if kind != "images" and count]
    of = f"(of {counts['images']} images, {' and '.join(reasons)})"
    if test_key:
        raise UserError(
            f"{where}: no image has an annotation to evaluate against {of}, so COCO "
            f"evaluation would report AP nan: add non-crowd annotations (iscrowd 0), or leave "
            f"the dataset out of {test_key} (tools/predict.py predicts on its images)"
        )
    raise UserError(
        f"{where}: no image has an annotation to train on {of}: add non-crowd annotations "
        f"(iscrowd 0), and check that their image_id values are the images' ids (detectron2 "
        f"drops annotations of unknown images) and that their polygons have 3 points or more "
        f"(detectron2 drops shorter ones)"
    )


def check_dataset_dicts(
    dicts: Sequence[dict], names: Sequence[str] = (), require_masks: bool = False
) -> None:
    """Raise a ValueError / FileNotFoundError naming the first bad image or annotation: the
    dataset (``names``), the image (id and file) and the annotation (its place in the image)."""
    datasets = ", ".join(map(repr, names))
    where = f" (dataset{'s' if len(names) > 1 else ''} {datasets})" if names else ""
    required = ("bbox", "category_id") + (("segmentation",) if require_masks else ())
    for record in dicts:
        file_name = record.get("file_name")
        if not file_name:
            raise UserError(f"image record {record.get('image_id')!r} has no file_name{where}")
        if not os.path.isfile(file_name):
            raise MissingFileError(f"image file {file_name} does not exist{where}")
        annotations = record.get("annotations", [])
        for number, annotation in enumerate(annotations, 1):
            which = (
                f"{'dataset ' + datasets + ', ' if names else ''}image id "
                f"{record.get('image_id')!r} ({file_name}), annotation {number} of "
                f"{len(annotations)}"
            )
            for key in required:
                if key not in annotation:
                    fix = (
                        "add it, or train without masks (MODEL.MASK_ON False)"
                        if key == "segmentation"
                        else "add it, or remove the annotation"
                    )
                    raise UserError(f"{which} has no {key!r}: {fix}")
            box = list(annotation["bbox"])
            if len(box) != 4 or not all(
                isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)
                for x in box
            ):
                raise UserError(
                    f"{which} has bbox={box}, not 4 finite numbers: fix or remove the annotation"
                )
            mode = annotation.get("bbox_mode", BoxMode.XYWH_ABS)
            x0, y0, x1, y1 = BoxMode.convert(box, mode, BoxMode.XYXY_ABS)
            if x1 < x0 or y1 < y0:
                raise UserError(
                    f"{which} has a box of negative size, bbox={box} "
                    f"({BoxMode(mode).name}): fix or remove the annotation"
                )
            segmentation = annotation.get("segmentation")
            problem = (
                segmentation_problem(segmentation, record.get("height"), record.get("width"))
                if segmentation
                else None
            )
            if problem:
                raise UserError(f"{which} has {problem}: fix or remove the annotation")


def check_num_classes(
    num_classes: Optional[Setting], names: Sequence[str], fix: Optional[str] = None
) -> None:
    """The model's class count (None: nothing to check) equals each dataset's number of
    categories (known once the dataset is loaded: detectron2's COCO loader sets
    ``thing_classes``); ``fix`` replaces the error's advice (to set the class count)."""
    if num_classes is None:
        return
    key, count = num_classes
    for name in names:
        classes = MetadataCatalog.get(name).get("thing_classes")
        if classes is not None and len(classes) != count:
            raise UserError(
                f"{key} is {count}, but {_describe(name)} has {len(classes)} "
                f"categories: "
                + (
                    fix
                    or f"add '{override(key, len(classes))}' to "
                    f"the command line (or set it in the "
                    f"config)"
                )
            )


def check_prediction_classes(cfg) -> None:
    """What tools/predict.py, tools/export_model.py and the demo's picture check of
    ``DATASETS.TEST[0]``, whose class names and category ids name the predictions: it is
    registered, and has as many categories as the model has classes (:func:`check_num_classes`;
    a dataset whose classes only its annotation file tells is loaded, when the file is there).
    A trained model is predicted with the config of its run, which holds both."""
    names = list(cfg.DATASETS.TEST[:1])
    _check_registered(names)
    for name in names:
        json_file = MetadataCatalog.get(name).get("json_file")
        if (
            MetadataCatalog.get(name).get("thing_classes") is None
            and json_file
            and PathManager.isfile(json_file)
        ):
            load_dataset(name)  # detectron2's COCO loader sets thing_classes
    check_num_classes(yaml_num_classes(cfg), names, fix=RUN_CONFIG_FIX)


def _oriented_size(image: Image.Image) -> Tuple[int, int]:
    """(width, height) after the EXIF rotation that detectron2's read_image applies."""
    width, height = image.size
    try:
        orientation = image.getexif().get(_EXIF_ORIENTATION)
    except Exception:  # detectron2 ignores unreadable EXIF data too
        orientation = None
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


def _has_end_marker(f, image_format: Optional[str]) -> bool:
    """The file ends with its format's end marker (formats without one: True)."""
    if image_format not in _END_MARKERS:
        return True
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - _TAIL_BYTES))
    return _END_MARKERS[image_format][0] in f.read()


def check_image_mode(file_name: str, mode: str) -> None:
    """An image of PIL mode ``mode`` reads as it shows (:data:`READABLE_IMAGE_MODES`), else a
    ValueError naming the file, its mode and the fix."""
    if mode in READABLE_IMAGE_MODES:
        return
    kind = "16-bit grayscale" if mode.startswith("I;16") else _HIGH_BIT_DEPTH_MODES.get(mode)
    if kind:
        raise UserError(
            f"image file {file_name} is {kind} (PIL mode {mode!r}), which "
            f"detectron2's read_image clips to 0-255 instead of scaling (a 16-bit "
            f"image reads as solid white): convert it to 8-bit, scaling its values "
            f"to 0-255"
        )
    raise UserError(
        f"image file {file_name} has PIL mode {mode!r}, which detectron2's "
        f"read_image does not read as it shows: convert it to 8-bit RGB"
    )


def read_checked_image(file_name: str, image_format: str = "BGR"):
    """An image file as the dataset checks accept it and training reads it: refused when its
    PIL mode does not read as it shows (:func:`check_image_mode`: 16-bit, 32-bit and float
    grayscale), else detectron2's ``read_image`` in ``image_format`` (8 bits per channel, EXIF
    rotation applied, palette and the other readable modes converted to what they show).
    tools/predict.py reads its images with it.

    Raises:
        ValueError: the file is not a readable image, or its mode is refused.
    """

    def unreadable(error: Exception) -> ValueError:
        problem = " ".join(f"{type(error).__name__}: {error}".split())
        return UserError(f"image file {file_name} is not a readable image ({problem})")

    try:
        with Image.open(file_name) as image:  # the header only
            mode = image.mode
    except Exception as error:  # PIL raises OSError, SyntaxError, ValueError, ...
        raise unreadable(error) from None
    check_image_mode(file_name, mode)
    try:
        return detection_utils.read_image(file_name, format=image_format)
    except Exception as error:
        raise unreadable(error) from None


def check_image_file(
    file_name: str,
    width: Optional[int] = None,
    height: Optional[int] = None,
    mode: str = CHECK_IMAGES,
    image_format: str = "BGR",
) -> None:
    """One image is readable as it shows (:func:`check_image_mode`) and, when given, ``width``
    x ``height`` (after EXIF rotation).

    ``mode`` "header" reads the header (PIL opens lazily) and, for JPEG and PNG, the file's tail:
    a file without its end marker is decoded in full (bytes after the marker are legal) and
    reported if that fails. "full" decodes every image as training will (detectron2's
    ``read_image`` with ``INPUT.FORMAT``); "none" does nothing.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: it is not a readable image, is truncated, its PIL mode does not read as it
            shows (16-bit grayscale, ...), or its size differs.
    """
    if mode == "none":
        return
    if mode not in IMAGE_CHECKS:
        raise UserError(
            f"DATALOADER.CHECK_IMAGES must be one of {list(IMAGE_CHECKS)}, got {mode!r}"
        )
    fix = "replace the file or remove it from the annotation file"
    missing_end = None
    try:
        with open(file_name, "rb") as f:
            with Image.open(f) as image:  # parses the header, decodes nothing
                size = _oriented_size(image)
                kind, pil_mode = image.format, image.mode
            if mode == "full":
                array = detection_utils.read_image(file_name, format=image_format)
                size = (array.shape[1], array.shape[0])
            elif not _has_end_marker(f, kind):
                missing_end = _END_MARKERS[kind][1]
                detection_utils.read_image(file_name, format=image_format)
    except FileNotFoundError:
        raise MissingFileError(f"image file {file_name} does not exist: {fix}") from None
    except Exception as error:  # PIL raises OSError, SyntaxError, ValueError, ... for bad files
        problem = (
            f"is truncated (no {missing_end} at its end, and decoding fails: {error})"
            if missing_end
            else f"is not a readable image ({type(error).__name__}: {error})"
        )
        raise UserError(f"image file {file_name} {' '.join(problem.split())}: {fix}") from None
    check_image_mode(file_name, pil_mode)
    if width is not None and height is not None and size != (width, height):
        raise UserError(
            f"image file {file_name} is {size[0]}x{size[1]} (width x height) but its "
            f"annotation says {width}x{height}: fix width/height in the annotation "
            f"file, or replace the image"
        )


def check_images(
    dicts: Sequence[dict],
    mode: str = CHECK_IMAGES,
    image_format: str = "BGR",
    threads: Optional[int] = None,
    key: str = "DATALOADER.CHECK_IMAGES",
) -> int:
    """:func:`check_image_file` for every record's image, in a thread pool (reading files
    waits on storage, which threads overlap). Returns the number of images checked. ``key``
    names ``mode`` in the error of an unknown one (a LazyConfig recipe's own key).

    Raises:
        the first bad image's error (FileNotFoundError or ValueError), with how many more
        images failed.
    """
    if mode not in IMAGE_CHECKS:
        raise UserError(f"{key} must be one of {list(IMAGE_CHECKS)}, got {mode!r}")
    if mode == "none" or not dicts:
        return 0
    files = {}  # an image listed twice (several datasets, repeat factors) is read once
    for record in dicts:
        files.setdefault(record["file_name"], (record.get("width"), record.get("height")))

    def check(item):
        file_name, (width, height) = item
        try:
            check_image_file(file_name, width, height, mode, image_format)
        except (FileNotFoundError, ValueError) as error:
            return file_name, error
        return None

    threads = threads or min(32, 4 * (os.cpu_count() or 1))
    with ThreadPoolExecutor(threads, thread_name_prefix="check_images") as pool:
        failures = [failure for failure in pool.map(check, files.items()) if failure]
    if failures:
        first = failures[0][1]
        more = (
            f" ({len(failures) - 1} more image files fail this check, e.g. {failures[1][0]})"
            if len(failures) > 1
            else ""
        )
        raise type(first)(f"{first}{more}")
    return len(files)


def _check_dataset_names(names: Setting, once: bool = False) -> None:
    """Each of ``names`` is a dataset's name (a string), and with ``once`` none is named twice:
    each test set is evaluated and reported once (a set named N times is evaluated N times,
    and its results under its name are only the last)."""
    seen = set()
    for name in names.value:
        if not isinstance(name, str):
            raise UserError(
                f"{names.key} holds {shown(name)}, not a dataset name: list the names of "
                f"registered datasets"
            )
        if once and name in seen:
            raise UserError(f"{names.key} names {name!r} more than once: name each test set once")
        seen.add(name)


class CheckedSet(NamedTuple):
    """What :func:`check_run_datasets` checked of one training or test set."""

    role: str  # "training" or "test"
    names: List[str]  # the datasets (a training set may join several)
    images: int  # image files checked: the images training or evaluation reads
    annotations: int
    dropped: Dict[str, int]  # images training leaves out, by reason

    def line(self) -> str:
        dropped = sum(self.dropped.values())
        why = ", ".join(f"{count} {reason}" for reason, count in self.dropped.items())
        left_out = f"; {dropped} image{'s' * (dropped != 1)} dropped ({why})" if dropped else ""
        return (
            f"{self.role} set {', '.join(self.names)}: {self.images} images, "
            f"{self.annotations} annotations{left_out}"
        )


def check_run_datasets(
    data: DataSettings, training: bool = True, threads: Optional[int] = None
) -> List[CheckedSet]:
    """The pre-flight of the data of both training tools (tools/check_dataset.py's with a
    config): each training (when ``training``) and test dataset is registered and loads, its
    COCO file is sound (:func:`check_annotation_file`), it has as many categories as the model
    has classes, and its images pass
    ``data.check_images``; the training set is checked as the trainer loads it
    (:func:`load_training_dicts`), each test set as evaluation reads it
    (:func:`load_checked_test_dicts`). Returns what was checked of each set, the training set
    first."""
    key, mode = data.check_images
    if mode not in IMAGE_CHECKS:
        raise UserError(f"{key} must be one of {list(IMAGE_CHECKS)}, got {shown(mode)}")
    if training:
        _check_dataset_names(data.train)
    _check_dataset_names(data.test, once=True)
    train, test = list(data.train.value), list(data.test.value)
    _check_registered([*(train if training else ()), *test])
    checked = []
    if training and train:
        dropped = {}
        dicts = load_training_dicts(data, check_files=True, dropped=dropped)
        check_num_classes(data.num_classes, train)
        images = check_images(dicts, mode, data.image_format, threads, key=key)
        checked.append(CheckedSet("training", train, images, _annotations(dicts), dropped))
    for name in test:
        dicts = load_checked_test_dicts(name, require_masks=data.masks, key=data.test.key)
        check_num_classes(data.num_classes, [name])
        images = check_images(dicts, mode, data.image_format, threads, key=key)
        checked.append(CheckedSet("test", [name], images, _annotations(dicts), {}))
    return checked


def _annotations(dicts: Sequence[dict]) -> int:
    return sum(len(record.get("annotations", ())) for record in dicts)
