"""Paper Table 14: LambdaResNet-152, Mask R-CNN, the paper's recipe
(COCO-InstanceSegmentation/lambda_r152_mask_rcnn.yaml as a LazyConfig)."""

from ..common.data import dataloader
from ..common.model import model
from ..common.schedule import lr_multiplier, optimizer, train

model.backbone.bottom_up.depth = 152
model.backbone.bottom_up.placement = "paper"
model.backbone.bottom_up.se = False

train.output_dir = "./output/lambda_r152_mask_rcnn"
