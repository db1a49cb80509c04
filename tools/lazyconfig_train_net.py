#!/usr/bin/env python
"""Train or evaluate a LazyConfig recipe (configs/LazyConfigs/), in the shape of detectron2's
tools/lazyconfig_train_net.py:

    python tools/lazyconfig_train_net.py --config lambda_r152_mask_rcnn --num-gpus 8
    python tools/lazyconfig_train_net.py --config lambda_r152_mask_rcnn --eval-only \\
        train.init_checkpoint=output/lambda_r152_mask_rcnn/model_final.pth
    python tools/lazyconfig_train_net.py \\
        --config-file configs/LazyConfigs/Demo/lambda_r26_shapes.py train.max_iter=100

``--config`` takes a path or a shipped recipe's name; trailing ``key=value`` pairs (hydra syntax)
override it, and ``+key=value`` adds an argument the recipe leaves out. Everything else is
tools/train_net.py's command line (docs/lazyconfig.md).
"""

import sys

from lambda_det.cli.lazyconfig_train_net import main

if __name__ == "__main__":
    sys.exit(main())
