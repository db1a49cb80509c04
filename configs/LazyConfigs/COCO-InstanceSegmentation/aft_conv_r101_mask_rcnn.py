"""AFT-conv ResNet-101 Mask R-CNN (COCO-InstanceSegmentation/aft_conv_r101_mask_rcnn.yaml as a
LazyConfig): AFT-conv blocks (Attention Free Transformer) where LambdaResNet-101 has lambda blocks
(c4 blocks 6, 12, 18 and all of c5), the paper's recipe."""

from lambda_det.modeling import use_mixer

from ..common.data import dataloader
from ..common.model import model
from ..common.schedule import lr_multiplier, optimizer, train

model.backbone.bottom_up.depth = 101
model.backbone.bottom_up.placement = "paper"
use_mixer(model.backbone.bottom_up, "aft_conv")  # its options (defaults) replace the lambda's

train.output_dir = "./output/aft_conv_r101_mask_rcnn"
