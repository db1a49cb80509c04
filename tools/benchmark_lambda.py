#!/usr/bin/env python
"""Lambda layer speed and memory, side by side in one process: every lambda_det implementation,
timm's and lucidrains' lambda layers, the 3x3 conv a lambda layer replaces, global multi-head
self-attention on the same feature map, and the Attention Free Transformer's mixers (AFT-conv,
-simple, -local, -full from lambda_det.layers).

The command line of lambda_det/cli/benchmark_lambda.py (``--help`` lists its options)."""

import sys

from lambda_det.cli.benchmark_lambda import main

if __name__ == "__main__":
    sys.exit(main())
