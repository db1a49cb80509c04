"""Paper Table 14: ResNet-152 + SE (ResNet-RS baseline), Mask R-CNN, the paper's recipe
(COCO-InstanceSegmentation/r152_se_mask_rcnn.yaml as a LazyConfig)."""

from ..common.data import dataloader
from ..common.model import model
from ..common.schedule import lr_multiplier, optimizer, train

model.backbone.bottom_up.depth = 152
model.backbone.bottom_up.placement = "none"
model.backbone.bottom_up.se = True

train.output_dir = "./output/r152_se_mask_rcnn"
