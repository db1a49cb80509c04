"""LambdaResNet backbones; importing this module registers the detectron2 builders."""
from lambda_det.compat import import_detectron2

import_detectron2()  # quietly, and with a helpful error when it is missing

from lambda_det.layers import eager_impls, flop_handles, register_flop_handles
from lambda_det.modeling.build import (
    build_lambda_resnet_backbone, build_lambda_resnet_fpn_backbone,
    build_retinanet_lambda_resnet_fpn_backbone)
from lambda_det.modeling.lambda_resnet import (
    BLOCKS_PER_STAGE, DEPTHS, PAPER_LAMBDA_BLOCKS_C4, PAPER_PARAMETERS, LambdaResNet,
    lambda_resnet, resolve_placement)
from lambda_det.modeling.mixers import (
    MIXERS, build_mixer_factory, register_mixer, unregister_mixer)

__all__ = ["LambdaResNet", "lambda_resnet", "resolve_placement", "DEPTHS", "BLOCKS_PER_STAGE",
           "PAPER_LAMBDA_BLOCKS_C4", "PAPER_PARAMETERS", "build_lambda_resnet_backbone",
           "build_lambda_resnet_fpn_backbone", "build_retinanet_lambda_resnet_fpn_backbone",
           "MIXERS", "register_mixer", "unregister_mixer", "build_mixer_factory",
           "flop_handles", "eager_impls"]

# fvcore's FlopCountAnalysis (so detectron2's analyze_model) counts the layers' ops: see
# lambda_det.layers.flops.
register_flop_handles()
