#!/usr/bin/env python
"""Parameter counts of LambdaResNets with a 1000-class head, side by side with the paper's
Tables 12 and 13 (k=16, h=4, u=1, scope 23x23). Prints a markdown table.

The command line of lambda_det/cli/param_counts.py (``--help`` lists its options)."""

import sys

from lambda_det.cli.param_counts import main

if __name__ == "__main__":
    sys.exit(main())
