"""The paper's COCO schedule (F.3): 130k steps at batch 256 on 64 processes (4 images each), SGD
with momentum 0.9, LR 0.32 warmed up from 0 over 1000 steps and divided by 10 at 90%, 95% and
97.5% of training, weight decay 4e-5 (none on norms).

train.reference_world_size 64: tools/lazyconfig_train_net.py rescales batch, LR and schedule
linearly for other process counts (0 turns that off).
"""

import torch
from detectron2.config import LazyCall as L
from detectron2.solver import get_default_optimizer_params

from lambda_det.solver import warmup_multistep
from lambda_det.utils import run_defaults

optimizer = L(torch.optim.SGD)(
    params=L(get_default_optimizer_params)(weight_decay_norm=0.0),  # the trainer sets .model
    lr=0.32,
    momentum=0.9,
    nesterov=False,
    weight_decay=4e-5,
)

lr_multiplier = L(warmup_multistep)(
    max_iter="${train.max_iter}",
    steps=[117000, 123500, 126750],  # 90%, 95%, 97.5%
    gamma=0.1,
    warmup_iters=1000,
    warmup_factor=0.0,
    warmup_method="linear",
)

train = dict(
    output_dir="./output",
    init_checkpoint="",  # from scratch; a checkpoint here must hold every backbone weight
    max_iter=130000,
    reference_world_size=64,
    device="cuda",  # cpu: SyncBN becomes naiveSyncBN, --num-gpus N starts N gloo processes
    seed=-1,  # -1 draws one
    # Every iteration a function of (seed, iteration): exact resume, the same global batches
    # for any number of processes (the yaml configs' DATALOADER.DETERMINISTIC). Needs seed >= 0.
    deterministic=False,
    # dtype: float16 (run_defaults.AMP_DTYPE) or bfloat16 (no loss scaling), GPU or CPU
    amp=dict(enabled=False, dtype=run_defaults.AMP_DTYPE),
    compile_backbone=False,  # torch.compile the backbone (LSJ crops give one input size)
    ddp=dict(broadcast_buffers=False, find_unused_parameters=False, fp16_compression=False),
    checkpointer=dict(period=5000, max_to_keep=100),
    eval_period=0,  # evaluate once, at the end
    log_period=run_defaults.LOG_PERIOD,
    cudnn_benchmark=False,
)
