#!/usr/bin/env python
"""Print runs' COCO AP by object size as a markdown table in the paper's Table 14 layout.

The command line of lambda_det/cli/ap_table.py (``--help`` lists its options)."""

import sys

from lambda_det.cli.ap_table import main

if __name__ == "__main__":
    sys.exit(main())
