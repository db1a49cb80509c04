"""lambda_det: LambdaNetworks (Bello, ICLR 2021) backbones for Detectron2.

Importing this package imports detectron2 (see :mod:`lambda_det.compat`) and registers the
project's backbones in detectron2's ``BACKBONE_REGISTRY``.
"""
from lambda_det.compat import import_detectron2

import_detectron2()

__version__ = "0.1.0"
__all__ = ["__version__"]
