#!/usr/bin/env python
"""Lambda layer speed and memory, side by side in one process: every lambda_det implementation,
timm's and lucidrains' lambda layers, the 3x3 conv a lambda layer replaces, global multi-head
self-attention on the same feature map, and the Attention Free Transformer's mixers (AFT-conv,
-simple, -local, -full from lambda_det.layers).

The command line of benchmarks/lambda_layer.py (``--help`` lists its options)."""

import sys
from pathlib import Path

# benchmarks/ is not installed with lambda_det: it is imported from this checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lambda_layer import main

if __name__ == "__main__":
    sys.exit(main())
