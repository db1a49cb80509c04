"""lambda_det: LambdaNetworks (Bello, ICLR 2021) backbones for Detectron2.

Importing this package imports detectron2 (see :mod:`lambda_det.compat`) and registers the
backbones in detectron2's ``BACKBONE_REGISTRY``:

* ``build_lambda_resnet_backbone``
* ``build_lambda_resnet_fpn_backbone``
* ``build_retinanet_lambda_resnet_fpn_backbone``

Typical use::

    import lambda_det
    cfg = lambda_det.get_cfg()            # detectron2's defaults + MODEL.LAMBDA_RESNET
    cfg.merge_from_file("configs/COCO-InstanceSegmentation/lambda_r152_mask_rcnn.yaml")
"""
from lambda_det.compat import import_detectron2

import_detectron2()

from lambda_det.config import add_lambda_resnet_config, get_cfg  # noqa: E402
from lambda_det.layers import LambdaLayer, RelativePositionEmbedding  # noqa: E402
from lambda_det.modeling import LambdaResNet, lambda_resnet  # noqa: E402

__version__ = "0.1.0"
__all__ = ["__version__", "add_lambda_resnet_config", "get_cfg", "LambdaLayer",
           "RelativePositionEmbedding", "LambdaResNet", "lambda_resnet"]
