"""AFT-conv ResNet-101 Mask R-CNN (COCO-InstanceSegmentation/aft_conv_r101_mask_rcnn.yaml as a
LazyConfig): AFT-conv blocks (Attention Free Transformer) where LambdaResNet-101 has lambda blocks
(c4 blocks 6, 12, 18 and all of c5), the paper's recipe."""
from ..common.data import dataloader
from ..common.model import model
from ..common.schedule import lr_multiplier, optimizer, train

for option in ("heads", "dim_k", "dim_u", "scope", "impl", "max_size",
               "share_position_embeddings"):
    del model.backbone.bottom_up[option]  # the lambda mixer's options
model.backbone.bottom_up.depth = 101
model.backbone.bottom_up.placement = "paper"
model.backbone.bottom_up.mixer = "aft_conv"
model.backbone.bottom_up.heads = 8
model.backbone.bottom_up.window_size = 7

train.output_dir = "./output/aft_conv_r101_mask_rcnn"
