#!/usr/bin/env python
"""Turn a LambdaResNet classifier trained with timm into MODEL.WEIGHTS for a detector.

The command line of lambda_det/cli/convert_timm_checkpoint.py (``--help`` lists its options)."""

import sys

from lambda_det.cli.convert_timm_checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
