#!/usr/bin/env python
"""Time a whole detector's training step: LambdaResNet Mask R-CNN against its ResNet-RS twin.

The command line of benchmarks/detector_step.py (``--help`` lists its options)."""

import sys
from pathlib import Path

# benchmarks/ is not installed with lambda_det: it is imported from this checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.detector_step import main

if __name__ == "__main__":
    sys.exit(main())
