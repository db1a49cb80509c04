#!/usr/bin/env python
"""Count the kernels one forward + backward of a lambda layer launches, as a GPU would run it.

The command line of benchmarks/count_kernels.py (``--help`` lists its options)."""

import sys
from pathlib import Path

# benchmarks/ is not installed with lambda_det: it is imported from this checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.count_kernels import main

if __name__ == "__main__":
    sys.exit(main())
