"""Large-scale jitter (LSJ) for yacs configs: the paper's COCO augmentation (F.3).

Detectron2 has the pieces (``ResizeScale`` + ``FixedSizeCrop``, as in its "new baselines"), but the
yacs ``DatasetMapper`` does not build them from a config; this module does, from ``INPUT.LSJ``.

Decision: LSJ is a training augmentation only. Evaluation keeps detectron2's test resize
(``INPUT.MIN_SIZE_TEST`` / ``MAX_SIZE_TEST``, 1024 / 1024 in the paper configs: longest side
to 1024), the same one ``DefaultPredictor`` applies, so the test size has a single source.
"""
from typing import List

from detectron2.data import DatasetMapper
from detectron2.data import transforms as T

__all__ = ["build_lsj_augmentations", "build_mapper"]


def build_lsj_augmentations(image_size: int, min_scale: float,
                            max_scale: float) -> List[T.Augmentation]:
    """Scale the image to [min_scale, max_scale] x image_size (aspect kept), crop or pad to
    image_size x image_size, random horizontal flip.
    """
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
    if not is_train or not cfg.INPUT.get("LSJ", None) or not cfg.INPUT.LSJ.ENABLED:
        return DatasetMapper(cfg, is_train)
    lsj = cfg.INPUT.LSJ
    augmentations = build_lsj_augmentations(lsj.IMAGE_SIZE, lsj.MIN_SCALE, lsj.MAX_SCALE)
    # The crop cuts masks, so boxes are recomputed from them (as detectron2 does for its crops).
    return DatasetMapper(cfg, is_train, augmentations=augmentations,
                         recompute_boxes=cfg.MODEL.MASK_ON)
