#!/usr/bin/env python
"""The main job (``make demo``): train a LambdaResNet Mask R-CNN on the bundled shapes dataset on
the CPU, evaluate it with COCO AP by object size, print the table and draw its predictions.

The command line of lambda_det/cli/demo.py (``--help`` lists its options)."""

import sys

from lambda_det.cli.demo import main

if __name__ == "__main__":
    sys.exit(main())
