#!/usr/bin/env python
"""The GPU report: the detector and lambda layer measurements a lent GPU is for, each beside
the CPU's prediction, written as they come (``--help`` lists the options; benchmarks/gpu_report.py
describes the sections).

    python tools/gpu_report.py --output gpu_report/
    python tools/gpu_report.py --device cpu --dry-run --output /tmp/gpu_report_dry
"""

import sys
from pathlib import Path

# benchmarks/ is not installed with lambda_det: it is imported from this checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_report import main

if __name__ == "__main__":
    sys.exit(main())
