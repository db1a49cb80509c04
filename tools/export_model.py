#!/usr/bin/env python
"""Export a trained lambda_det model (e.g. a LambdaResNet Mask R-CNN) to TorchScript, ONNX or
torch.export.

The command line of lambda_det/cli/export_model.py (``--help`` lists its options)."""

import sys

from lambda_det.cli.export_model import main

if __name__ == "__main__":
    sys.exit(main())
