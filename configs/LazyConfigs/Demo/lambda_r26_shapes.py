"""The bundled demo (Demo/lambda_r26_shapes.yaml as a LazyConfig): a narrow LambdaResNet-26 Mask
R-CNN on the synthetic shapes dataset, trained from scratch on the CPU in minutes. The paper's
recipe scaled down: 256x256 inputs, jitter [0.5, 1.5] (the paper's [0.1, 2.0] shrinks 12 px
objects to nothing at this size), a short schedule with the same 90/95/97.5% LR drops, and
thinned heads (at this size they, not the backbone, dominate a CPU step).
"""

from ..common.data import dataloader
from ..common.model import model
from ..common.schedule import lr_multiplier, optimizer, train

model.backbone.bottom_up.depth = 26
model.backbone.bottom_up.width_multiplier = 0.5
model.backbone.bottom_up.scope = 7
model.backbone.out_channels = 32  # reaches the RPN and RoI heads by interpolation
model.proposal_generator.anchor_generator.sizes = [[16], [32], [64], [128], [256]]
model.proposal_generator.pre_nms_topk = [500, 500]
model.proposal_generator.post_nms_topk = [250, 300]
model.roi_heads.num_classes = 3
model.roi_heads.batch_size_per_image = 64
model.roi_heads.box_head.conv_dims = [32, 32, 32, 32]
model.roi_heads.box_head.fc_dims = [256]
model.roi_heads.box_predictor.input_shape.channels = 256
model.roi_heads.mask_head.conv_dims = [32, 32, 32, 32, 32]

dataloader.train.dataset.names = ["lambda_det_shapes_train"]
dataloader.train.mapper.augmentations.update(image_size=256, min_scale=0.5, max_scale=1.5)
dataloader.train.total_batch_size = 8
dataloader.train.num_workers = 1
dataloader.test.dataset.names = "lambda_det_shapes_val"
dataloader.test.mapper.augmentations[0].update(short_edge_length=256, max_size=256)
dataloader.test.num_workers = 1

optimizer.lr = 0.04
optimizer.weight_decay = 0.0001
lr_multiplier.steps = [540, 570, 585]
lr_multiplier.warmup_iters = 50

train.max_iter = 600
train.reference_world_size = 0  # as many processes as --num-gpus, 8 images per step in all
train.device = "cpu"
train.checkpointer.period = 200  # an interruption loses minutes; --resume continues
train.seed = 52650618  # the seed of the run whose numbers the README quotes
train.output_dir = "./output/demo_lambda_r26_shapes"
