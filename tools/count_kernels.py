#!/usr/bin/env python
"""Count the kernels one forward + backward of a lambda layer launches, as a GPU would run it.

The command line of lambda_det/cli/count_kernels.py (``--help`` lists its options)."""

import sys

from lambda_det.cli.count_kernels import main

if __name__ == "__main__":
    sys.exit(main())
