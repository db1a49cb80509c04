"""COCO with the paper's large-scale jitter (F.3): training images resized to [0.1, 2.0] x 1024
and cropped or padded to 1024 x 1024; evaluation at longest side 1024 (LSJ is training only)."""

from detectron2.config import LazyCall as L
from detectron2.data import (
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from detectron2.data import transforms as T
from detectron2.evaluation import COCOEvaluator
from omegaconf import OmegaConf

from lambda_det.data import DatasetMapper, build_lsj_augmentations  # names unreadable images
from lambda_det.data.checks import load_checked_dataset_dicts
from lambda_det.utils import run_defaults

dataloader = OmegaConf.create()

dataloader.train = L(build_detection_train_loader)(
    dataset=L(load_checked_dataset_dicts)(
        names=["coco_2017_train"], filter_empty=True, require_masks=True
    ),
    mapper=L(DatasetMapper)(
        is_train=True,
        augmentations=L(build_lsj_augmentations)(image_size=1024, min_scale=0.1, max_scale=2.0),
        image_format="BGR",
        use_instance_mask=True,
        instance_mask_format="bitmask",  # the crop cuts masks; bitmasks need no polygon clipping
        recompute_boxes=True,  # boxes of cropped objects, from their masks
    ),
    total_batch_size=256,  # images per iteration over all processes
    aspect_ratio_grouping=True,
    num_workers=4,
)

dataloader.test = L(build_detection_test_loader)(
    dataset=L(get_detection_dataset_dicts)(names="coco_2017_val", filter_empty=False),
    mapper=L(DatasetMapper)(
        is_train=False,
        augmentations=[
            L(T.ResizeShortestEdge)(short_edge_length=1024, max_size=1024, sample_style="choice")
        ],
        image_format="BGR",
    ),
    num_workers=4,
)

# Before training: every image's header is read ("header"; "full": decoded; "none": skipped).
dataloader.check_images = run_defaults.CHECK_IMAGES

dataloader.evaluator = L(COCOEvaluator)(
    dataset_name="${..test.dataset.names}",
    output_dir="${train.output_dir}/inference/${..test.dataset.names}",
)
