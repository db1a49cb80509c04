#!/usr/bin/env python
"""Run a trained model on your own images and videos, in the shape of detectron2's demo/demo.py.

The command line of lambda_det/cli/predict.py (``--help`` lists its options)."""

import sys

from lambda_det.cli.predict import main

if __name__ == "__main__":
    sys.exit(main())
