#!/usr/bin/env python
"""Time a whole detector's training step: LambdaResNet Mask R-CNN against its ResNet-RS twin.

The command line of lambda_det/cli/benchmark_detector.py (``--help`` lists its options)."""

import sys

from lambda_det.cli.benchmark_detector import main

if __name__ == "__main__":
    sys.exit(main())
