#!/usr/bin/env python
"""Compare backbones under one recipe: train and evaluate every (variant, seed) with
tools/train_net.py, then report AP over seeds, paired differences to a baseline, parameters
and time per iteration (OUTPUT/comparison.md, .json, .png).

The command line of lambda_det/cli/compare_backbones.py (``--help`` lists its options)."""

import sys

from lambda_det.cli.compare_backbones import main

if __name__ == "__main__":
    sys.exit(main())
