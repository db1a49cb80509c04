"""lambda_det: LambdaNetworks (Bello, ICLR 2021) backbones for Detectron2.

The shared core, :mod:`lambda_det.layers`, and the LambdaResNet model (``lambda_det.LambdaResNet``,
``lambda_det.lambda_resnet``, the timm models of :mod:`lambda_det.modeling.timm_models`) need
torch alone, and work in any PyTorch project; ``lambda_det.LambdaResNetBackbone`` is the
detectron2 ``Backbone`` over the model.
Where detectron2 is installed, importing this package registers the backbones in detectron2's
``BACKBONE_REGISTRY`` (``build_lambda_resnet_backbone``, ``build_lambda_resnet_fpn_backbone``,
``build_retinanet_lambda_resnet_fpn_backbone``; :mod:`lambda_det.modeling`), as a detectron2
plug-in does; without detectron2 it imports nothing beyond itself. The names below
(``lambda_det.get_cfg``, ``lambda_det.LambdaResNet``, ...) import their module on first access.

Typical use::

    import lambda_det                     # registers the backbones
    cfg = lambda_det.get_cfg()            # detectron2's defaults + lambda_det's keys
    cfg.merge_from_file("configs/COCO-InstanceSegmentation/lambda_r152_mask_rcnn.yaml")
"""

import importlib

from lambda_det.compat import detectron2_installed
from lambda_det.compat.torch_features import check_torch_floor

check_torch_floor()  # an older torch than setup.py's floor stops here, in one line

__version__ = "0.1.0"

# Each public name and the module that defines it, imported on first access.
_LAZY_NAMES = {
    "add_lambda_det_config": "lambda_det.config",
    "add_lambda_resnet_config": "lambda_det.modeling",
    "get_cfg": "lambda_det.run_config",
    "load_config": "lambda_det.run_config",
    "LambdaLayer": "lambda_det.layers",
    "RelativePositionEmbedding": "lambda_det.layers",
    "LambdaResNet": "lambda_det.modeling",
    "lambda_resnet": "lambda_det.modeling",
    "LambdaResNetBackbone": "lambda_det.modeling",
}
# lambda_det.modeling imports without detectron2; its detectron2 names say what is missing.
_NEEDS_DETECTRON2 = ("lambda_det.config", "lambda_det.run_config")

__all__ = ["__version__", *_LAZY_NAMES]


def __getattr__(name: str):
    module_name = _LAZY_NAMES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'lambda_det' has no attribute {name!r}")
    if module_name in _NEEDS_DETECTRON2:
        from lambda_det.compat import import_detectron2

        import_detectron2()  # quietly, and with a helpful error if it is missing
    return getattr(importlib.import_module(module_name), name)


def __dir__():
    return sorted(set(globals()) | set(_LAZY_NAMES))


if detectron2_installed():
    importlib.import_module("lambda_det.modeling")  # registers the backbones
