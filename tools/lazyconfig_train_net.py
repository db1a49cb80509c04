#!/usr/bin/env python
"""Train or evaluate a LazyConfig recipe (configs/LazyConfigs/), in the shape of detectron2's
tools/lazyconfig_train_net.py:

    python tools/lazyconfig_train_net.py --config lambda_r152_mask_rcnn --num-gpus 8
    python tools/lazyconfig_train_net.py --config lambda_r152_mask_rcnn --eval-only \\
        train.init_checkpoint=output/lambda_r152_mask_rcnn/model_final.pth
    python tools/lazyconfig_train_net.py --config-file configs/LazyConfigs/Demo/lambda_r26_shapes.py \\
        train.max_iter=100

``--config`` takes a path or a shipped recipe's name; trailing ``key=value`` pairs (hydra syntax)
override it, and ``+key=value`` adds an argument the recipe leaves out. The rest is as
tools/train_net.py: one run per train.output_dir (--resume, --restart), weights loaded safely,
gloo processes with train.device=cpu, a mistake in the input reported as one ``error: ...`` line
with exit status 2 (--debug for its traceback), results in train.output_dir/eval_results.json
(--eval-only into a train.output_dir that holds a run: in a new train.output_dir/eval_<date-time>/).
"""
import sys

import lambda_det.data  # noqa: F401  (registers the bundled datasets)
from lambda_det.cli.train_net import lazyconfig_main as main

if __name__ == "__main__":
    sys.exit(main())
