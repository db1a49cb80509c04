"""Large-scale jitter (LSJ) for yacs configs: the paper's COCO augmentation (F.3).

Detectron2 has the pieces (``ResizeScale`` + ``FixedSizeCrop``, as in its "new baselines"), but the
yacs ``DatasetMapper`` does not build them from a config; this module does, from ``INPUT.LSJ``.

Decision: LSJ is a training augmentation only. Evaluation keeps detectron2's test resize
(``INPUT.MIN_SIZE_TEST`` / ``MAX_SIZE_TEST``, 1024 / 1024 in the paper configs: longest side
to 1024), the same one ``DefaultPredictor`` applies, so the test size has a single source.

The mapper is detectron2's ``DatasetMapper``, with one difference: an image it cannot read is
named (:class:`DatasetMapper`).
"""

import logging
from typing import List, Sequence

from detectron2.data import DatasetMapper as Detectron2DatasetMapper
from detectron2.data import detection_utils
from detectron2.data import transforms as T

from lambda_det.utils.errors import MissingFileError, UserError

__all__ = [
    "build_lsj_augmentations",
    "check_lsj_settings",
    "build_mapper",
    "DatasetMapper",
    "MIN_LSJ_IMAGE_SIZE",
]

logger = logging.getLogger(__name__)

# The backbones' coarsest stride (res5): a smaller crop has no res5 pixel.
MIN_LSJ_IMAGE_SIZE = 32
LSJ_KEYS = ("IMAGE_SIZE", "MIN_SCALE", "MAX_SCALE")


def check_lsj_settings(
    image_size: int, min_scale: float, max_scale: float, keys: Sequence[str] = LSJ_KEYS
) -> None:
    """The crop side is an integer of at least :data:`MIN_LSJ_IMAGE_SIZE`, and
    0 < min_scale <= max_scale; ``keys`` name the three values in the errors (the config's keys).

    Raises:
        ValueError: naming the key, the value and the fix.
    """
    size_key, min_key, max_key = keys
    if (
        isinstance(image_size, bool)
        or not isinstance(image_size, int)
        or (image_size < MIN_LSJ_IMAGE_SIZE)
    ):
        raise UserError(
            f"{size_key} must be an integer >= {MIN_LSJ_IMAGE_SIZE} (the backbone's "
            f"coarsest stride), got {image_size!r}: set {size_key} to the side of "
            f"the training crop, e.g. 1024"
        )
    if not 0 < min_scale <= max_scale:
        raise UserError(
            f"LSJ scales must satisfy 0 < {min_key} <= {max_key}, got {min_scale} "
            f"and {max_scale}: set {min_key} to a positive scale no larger than "
            f"{max_key}"
        )


def build_lsj_augmentations(
    image_size: int, min_scale: float, max_scale: float, is_train: bool = True
) -> List[T.Augmentation]:
    """Scale the image to [min_scale, max_scale] x image_size (aspect kept), crop or pad to
    image_size x image_size, random horizontal flip. Training only (``is_train=False`` is an
    error: evaluation uses detectron2's test resize, see the module docstring).
    """
    if not is_train:
        raise UserError(
            "LSJ is a training augmentation; evaluation resizes by "
            "INPUT.MIN_SIZE_TEST / MAX_SIZE_TEST (detectron2's DatasetMapper)"
        )
    check_lsj_settings(image_size, min_scale, max_scale)
    return [
        T.ResizeScale(
            min_scale=min_scale,
            max_scale=max_scale,
            target_height=image_size,
            target_width=image_size,
        ),
        T.FixedSizeCrop(crop_size=(image_size, image_size)),
        T.RandomFlip(horizontal=True),
    ]


def _raised_in(error: BaseException, function) -> bool:
    """Whether ``error`` was raised inside ``function`` (a frame of its code is on the
    traceback)."""
    traceback = error.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code is function.__code__:
            return True
        traceback = traceback.tb_next
    return False


class DatasetMapper(Detectron2DatasetMapper):
    """Detectron2's ``DatasetMapper`` (the same outputs), whose failure to read an image names
    the file: PIL's own errors ("image file is truncated", "cannot identify image file <file
    object>") do not, and they surface from a data-loader worker."""

    def __call__(self, dataset_dict):
        try:
            return super().__call__(dataset_dict)
        except Exception as error:
            if not _raised_in(error, detection_utils.read_image):
                raise
            file_name = dataset_dict.get("file_name")
            if isinstance(error, FileNotFoundError):
                raise MissingFileError(
                    f"image file {file_name} no longer exists: restore it "
                    f"or remove it from the annotation file"
                ) from error
            message = " ".join(f"{type(error).__name__}: {error}".split())
            raise UserError(
                f"image file {file_name} cannot be decoded ({message}): replace it "
                f"or remove it from the annotation file (DATALOADER.CHECK_IMAGES "
                f"full finds every such file before training)"
            ) from error


def build_mapper(cfg, is_train: bool) -> DatasetMapper:
    """:class:`DatasetMapper`, with LSJ augmentations for training when ``INPUT.LSJ.ENABLED``."""
    lsj = cfg.INPUT.get("LSJ", None)
    if not lsj or not lsj.ENABLED:
        return DatasetMapper(cfg, is_train)
    if not is_train:
        if lsj.IMAGE_SIZE != cfg.INPUT.MAX_SIZE_TEST:
            logger.warning(
                "evaluating at INPUT.MIN_SIZE_TEST / MAX_SIZE_TEST = %s / %s, not at "
                "the training size INPUT.LSJ.IMAGE_SIZE = %s (set both to change it)",
                cfg.INPUT.MIN_SIZE_TEST,
                cfg.INPUT.MAX_SIZE_TEST,
                lsj.IMAGE_SIZE,
            )
        return DatasetMapper(cfg, is_train)
    augmentations = build_lsj_augmentations(lsj.IMAGE_SIZE, lsj.MIN_SCALE, lsj.MAX_SCALE)
    # The crop cuts masks, so boxes are recomputed from them (as detectron2 does for its crops).
    return DatasetMapper(
        cfg, is_train, augmentations=augmentations, recompute_boxes=cfg.MODEL.MASK_ON
    )
