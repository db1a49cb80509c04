"""``python -m lambda_det.d2tool SCRIPT ...``: one of detectron2's own scripts (its ``tools/``)
on lambda_det's configs; the command is :mod:`lambda_det.cli.d2tool`."""

import sys

from lambda_det.cli.d2tool import main

if __name__ == "__main__":
    sys.exit(main())
