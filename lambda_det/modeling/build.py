"""Detectron2 builders for LambdaResNet backbones (plain, FPN, RetinaNet FPN).

Set ``MODEL.BACKBONE.NAME`` to one of these in any detectron2 config that has the
``MODEL.LAMBDA_RESNET`` node (``lambda_det.add_lambda_resnet_config`` or ``lambda_det.get_cfg``).
"""
from typing import Any, Callable, Dict

from detectron2.config import CfgNode
from detectron2.layers import ShapeSpec
from detectron2.modeling import BACKBONE_REGISTRY, FPN
from detectron2.modeling.backbone.fpn import LastLevelMaxPool, LastLevelP6P7
from lambda_det.config import MISSING_CONFIG_HINT
from lambda_det.modeling.lambda_resnet import LambdaResNet
from lambda_det.modeling.mixers import MIXERS

__all__ = ["build_lambda_resnet_backbone", "build_lambda_resnet_fpn_backbone",
           "build_retinanet_lambda_resnet_fpn_backbone", "lambda_resnet_from_config",
           "MIXER_OPTIONS_FROM_CONFIG"]

# Each mixer's options from its MODEL.LAMBDA_RESNET keys; a registered mixer not listed here is
# built with its defaults.
MIXER_OPTIONS_FROM_CONFIG: Dict[str, Callable[[CfgNode], Dict[str, Any]]] = {
    "lambda": lambda node: dict(
        heads=node.HEADS,
        dim_k=node.DIM_K,
        dim_u=node.DIM_U,
        scope=node.SCOPE or None,  # 0 in a config means global context
        impl=node.IMPL,
        max_size=node.MAX_SIZE,
        share_position_embeddings=node.SHARE_POSITION_EMBEDDINGS,
    ),
    "aft_conv": lambda node: dict(heads=node.AFT_HEADS, window_size=node.AFT_WINDOW_SIZE),
}


def lambda_resnet_from_config(cfg, input_shape: ShapeSpec) -> LambdaResNet:
    """A LambdaResNet from ``cfg.MODEL.LAMBDA_RESNET`` and ``cfg.MODEL.BACKBONE.FREEZE_AT``."""
    if "LAMBDA_RESNET" not in cfg.MODEL:
        raise KeyError(f"MODEL.LAMBDA_RESNET is missing: {MISSING_CONFIG_HINT}")
    node = cfg.MODEL.LAMBDA_RESNET
    if node.MIXER not in MIXERS:
        raise ValueError(f"MODEL.LAMBDA_RESNET.MIXER {node.MIXER!r} is not a registered mixer; "
                         f"they are {', '.join(repr(name) for name in sorted(MIXERS))}")
    options_from_config = MIXER_OPTIONS_FROM_CONFIG.get(node.MIXER, lambda node: {})
    return LambdaResNet(
        node.DEPTH,
        placement=node.PLACEMENT,
        se=node.SE,
        out_features=list(node.OUT_FEATURES),
        norm=node.NORM,
        freeze_at=cfg.MODEL.BACKBONE.FREEZE_AT,
        width_multiplier=node.WIDTH_MULTIPLIER,
        in_channels=input_shape.channels,
        mixer=node.MIXER,
        **options_from_config(node),
    )


def _fpn_in_features(cfg, bottom_up: LambdaResNet):
    """MODEL.FPN.IN_FEATURES, checked against what the LambdaResNet outputs."""
    in_features = list(cfg.MODEL.FPN.IN_FEATURES)
    outputs = list(cfg.MODEL.LAMBDA_RESNET.OUT_FEATURES)
    missing = [name for name in in_features if name not in bottom_up.output_shape()]
    if missing:
        raise ValueError(f"MODEL.FPN.IN_FEATURES {in_features} needs {missing}, which "
                         f"MODEL.LAMBDA_RESNET.OUT_FEATURES {outputs} does not output")
    return in_features


@BACKBONE_REGISTRY.register()
def build_lambda_resnet_backbone(cfg, input_shape: ShapeSpec) -> LambdaResNet:
    """The LambdaResNet alone (e.g. for C4-style heads): outputs MODEL.LAMBDA_RESNET.OUT_FEATURES."""
    return lambda_resnet_from_config(cfg, input_shape)


@BACKBONE_REGISTRY.register()
def build_lambda_resnet_fpn_backbone(cfg, input_shape: ShapeSpec) -> FPN:
    """LambdaResNet + FPN with P6 by max-pooling: the R-CNN family's backbone."""
    bottom_up = lambda_resnet_from_config(cfg, input_shape)
    return FPN(
        bottom_up=bottom_up,
        in_features=_fpn_in_features(cfg, bottom_up),
        out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
        norm=cfg.MODEL.FPN.NORM,
        top_block=LastLevelMaxPool(),
        fuse_type=cfg.MODEL.FPN.FUSE_TYPE,
    )


@BACKBONE_REGISTRY.register()
def build_retinanet_lambda_resnet_fpn_backbone(cfg, input_shape: ShapeSpec) -> FPN:
    """LambdaResNet + FPN with P6/P7 from res5: RetinaNet's backbone."""
    bottom_up = lambda_resnet_from_config(cfg, input_shape)
    return FPN(
        bottom_up=bottom_up,
        in_features=_fpn_in_features(cfg, bottom_up),
        out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
        norm=cfg.MODEL.FPN.NORM,
        top_block=LastLevelP6P7(bottom_up.output_shape()["res5"].channels,
                                cfg.MODEL.FPN.OUT_CHANNELS),
        fuse_type=cfg.MODEL.FPN.FUSE_TYPE,
    )
