"""A conftest.py that runs detectron2's own tests with a LambdaResNet (docs/ecosystem.md).

Copy it as conftest.py into the tests/ folder of a detectron2 checkout and run its tests with
lambda_det importable. detectron2's three ResNet builders, in its backbone registry (what
build_model and build_backbone look up) and as the functions the tests import, build lambda_det's
LambdaResNet instead, from the same config: MODEL.LAMBDA_RESNET is added at its defaults, so
DEPTH, NORM and OUT_FEATURES follow MODEL.RESNETS. LazyConfigs that name detectron2's ResNet
class itself keep it. Checked with detectron2 v0.6's tests.
"""

import detectron2.modeling.backbone as backbone
import detectron2.modeling.backbone.fpn as fpn
import detectron2.modeling.backbone.resnet as resnet
import yaml
from detectron2.config import CfgNode, get_cfg
from detectron2.modeling import BACKBONE_REGISTRY
from omegaconf import OmegaConf

from lambda_det.compat.internals import replace_registered
from lambda_det.modeling import add_lambda_resnet_config  # and registers the builders

SWAP = {
    "build_resnet_backbone": "build_lambda_resnet_backbone",
    "build_resnet_fpn_backbone": "build_lambda_resnet_fpn_backbone",
    "build_retinanet_resnet_fpn_backbone": "build_retinanet_lambda_resnet_fpn_backbone",
}


def with_lambda_resnet_keys(cfg):
    """``cfg`` with MODEL.LAMBDA_RESNET at its defaults (detectron2's get_cfg() has none)."""
    if "LAMBDA_RESNET" in cfg.MODEL:
        return cfg
    if isinstance(cfg, CfgNode):
        cfg = cfg.clone()
        cfg.defrost()
        return add_lambda_resnet_config(cfg)
    # an OmegaConf config, which detectron2's builders take too
    keys = add_lambda_resnet_config(get_cfg()).MODEL.LAMBDA_RESNET
    return OmegaConf.merge(cfg, {"MODEL": {"LAMBDA_RESNET": yaml.safe_load(keys.dump())}})


def swapped(name):
    build = BACKBONE_REGISTRY.get(name)

    def build_lambda(cfg, input_shape):
        return build(with_lambda_resnet_keys(cfg), input_shape)

    return build_lambda


for stock, ours in SWAP.items():
    replace_registered(BACKBONE_REGISTRY, stock, swapped(ours))
    for module in (backbone, fpn, resnet):
        if hasattr(module, stock):
            setattr(module, stock, BACKBONE_REGISTRY.get(stock))
