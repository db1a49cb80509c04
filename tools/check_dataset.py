#!/usr/bin/env python
"""Check datasets as tools/train_net.py does before training, and time the image checks.

The command line of lambda_det/cli/check_dataset.py (``--help`` lists its options)."""

import sys

from lambda_det.cli.check_dataset import main

if __name__ == "__main__":
    sys.exit(main())
