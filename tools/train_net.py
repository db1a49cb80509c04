#!/usr/bin/env python
"""Train or evaluate a yaml config (configs/), in the shape of detectron2's tools/train_net.py:

    python tools/train_net.py --config lambda_r152_mask_rcnn --num-gpus 8
    python tools/train_net.py --config lambda_r152_mask_rcnn --eval-only MODEL.WEIGHTS model.pth
    python tools/train_net.py --config-file configs/Demo/lambda_r26_shapes.yaml MODEL.DEVICE cpu

``--config`` takes a path or a shipped config's name; trailing ``KEY VALUE`` pairs override it.
What it adds to detectron2's script (one run per output folder, checks before launch, safe
weights, one-line errors): README.md, "Training and evaluating", and docs/safety.md.
tools/lazyconfig_train_net.py is the same command line for LazyConfig recipes.
"""

import sys

from lambda_det.cli.train_net import main

if __name__ == "__main__":
    sys.exit(main())
