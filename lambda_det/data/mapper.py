"""Large-scale jitter (LSJ) for yacs configs: the paper's COCO augmentation (F.3).

Detectron2 has the pieces (``ResizeScale`` + ``FixedSizeCrop``, as in its "new baselines"), but the
yacs ``DatasetMapper`` does not build them from a config; this module does, from ``INPUT.LSJ``.

Decision: LSJ is a training augmentation only. Evaluation keeps detectron2's test resize
(``INPUT.MIN_SIZE_TEST`` / ``MAX_SIZE_TEST``, 1024 / 1024 in the paper configs: longest side
to 1024), the same one ``DefaultPredictor`` applies, so the test size has a single source.
"""
import logging
from typing import List

from detectron2.data import DatasetMapper
from detectron2.data import transforms as T

__all__ = ["build_lsj_augmentations", "build_mapper"]

logger = logging.getLogger(__name__)


def build_lsj_augmentations(image_size: int, min_scale: float, max_scale: float,
                            is_train: bool = True) -> List[T.Augmentation]:
    """Scale the image to [min_scale, max_scale] x image_size (aspect kept), crop or pad to
    image_size x image_size, random horizontal flip. Training only (``is_train=False`` is an
    error: evaluation uses detectron2's test resize, see the module docstring).
    """
    if not is_train:
        raise ValueError("LSJ is a training augmentation; evaluation resizes by "
                         "INPUT.MIN_SIZE_TEST / MAX_SIZE_TEST (detectron2's DatasetMapper)")
    if not 0 < min_scale <= max_scale:
        raise ValueError(f"LSJ scales must satisfy 0 < MIN_SCALE <= MAX_SCALE, got "
                         f"{min_scale} and {max_scale}")
    return [T.ResizeScale(min_scale=min_scale, max_scale=max_scale,
                          target_height=image_size, target_width=image_size),
            T.FixedSizeCrop(crop_size=(image_size, image_size)),
            T.RandomFlip(horizontal=True)]


def build_mapper(cfg, is_train: bool) -> DatasetMapper:
    """Detectron2's ``DatasetMapper``, with LSJ augmentations for training when
    ``INPUT.LSJ.ENABLED``."""
    lsj = cfg.INPUT.get("LSJ", None)
    if not lsj or not lsj.ENABLED:
        return DatasetMapper(cfg, is_train)
    if not is_train:
        if lsj.IMAGE_SIZE != cfg.INPUT.MAX_SIZE_TEST:
            logger.warning("evaluating at INPUT.MIN_SIZE_TEST / MAX_SIZE_TEST = %s / %s, not at "
                           "the training size INPUT.LSJ.IMAGE_SIZE = %s (set both to change it)",
                           cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST, lsj.IMAGE_SIZE)
        return DatasetMapper(cfg, is_train)
    augmentations = build_lsj_augmentations(lsj.IMAGE_SIZE, lsj.MIN_SCALE, lsj.MAX_SCALE)
    # The crop cuts masks, so boxes are recomputed from them (as detectron2 does for its crops).
    return DatasetMapper(cfg, is_train, augmentations=augmentations,
                         recompute_boxes=cfg.MODEL.MASK_ON)
