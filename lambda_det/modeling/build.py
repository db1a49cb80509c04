"""Detectron2 builders for LambdaResNet backbones (plain, FPN, RetinaNet FPN).

Set ``MODEL.BACKBONE.NAME`` to one of these in any detectron2 config that has the backbone's keys
(``lambda_det.run_config.get_cfg`` or ``add_lambda_resnet_config``). The swap keeps what a stock
config says: ``MODEL.LAMBDA_RESNET.DEPTH``, ``NORM`` and ``OUT_FEATURES`` left unset (None)
follow ``MODEL.RESNETS.DEPTH``, ``NORM`` and ``OUT_FEATURES``, and the build logs which it took;
``MODEL.RESNETS`` keys a LambdaResNet has no use for are named in a warning when set.

With C4 heads (``build_lambda_resnet_backbone``, ``OUT_FEATURES ["res4"]`` and detectron2's
``Res5ROIHeads``), the backbone has no res5 and the heads build their own from
``MODEL.RESNETS``. Its input channels, ``4 * MODEL.RESNETS.RES2_OUT_CHANNELS``, must be the
LambdaResNet's res4 channels, so ``RES2_OUT_CHANNELS`` must be 256 x ``WIDTH_MULTIPLIER``; the
build names the value to set otherwise.
"""

import logging
import re

from detectron2.layers import ShapeSpec
from detectron2.modeling import (
    BACKBONE_REGISTRY,
    FPN,
    META_ARCH_REGISTRY,
    ROI_HEADS_REGISTRY,
    GeneralizedRCNN,
    build_model,
)
from detectron2.modeling.backbone.fpn import LastLevelMaxPool, LastLevelP6P7
from detectron2.modeling.roi_heads import Res5ROIHeads

from lambda_det.modeling.backbone import LambdaResNetBackbone
from lambda_det.modeling.config import mixer_options_from_node
from lambda_det.modeling.mixers import MIXERS
from lambda_det.utils.errors import UserError, UserKeyError

__all__ = [
    "build_detectron2_model",
    "build_lambda_resnet_backbone",
    "build_lambda_resnet_fpn_backbone",
    "build_retinanet_lambda_resnet_fpn_backbone",
    "lambda_resnet_from_config",
    "backbone_setting",
    "check_c4_head_channels",
    "STOCK_IMAGENET_WEIGHTS",
    "has_c4_heads",
    "LAMBDA_DET_BACKBONES",
]

# Said by the backbone builders when a config lacks MODEL.LAMBDA_RESNET.
MISSING_CONFIG_HINT = (
    "this config uses lambda_det's MODEL.LAMBDA_RESNET node, which detectron2's defaults do not "
    "have: call lambda_det.modeling.add_lambda_resnet_config(cfg) before merging it, or start "
    "from lambda_det.run_config.get_cfg()"
)

logger = logging.getLogger(__name__)

LAMBDA_DET_BACKBONES = (
    "build_lambda_resnet_backbone",
    "build_lambda_resnet_fpn_backbone",
    "build_retinanet_lambda_resnet_fpn_backbone",
)
# MODEL.LAMBDA_RESNET keys that, left None, take their MODEL.RESNETS counterpart.
FOLLOWS_RESNETS = ("DEPTH", "NORM", "OUT_FEATURES")
# MODEL.RESNETS keys of detectron2's ResNet that a LambdaResNet (ResNet-RS blocks) does not have,
# with detectron2's defaults.
UNUSED_RESNETS_KEYS = {
    "NUM_GROUPS": 1,
    "WIDTH_PER_GROUP": 64,
    "RES5_DILATION": 1,
    "STEM_OUT_CHANNELS": 64,
    "RES2_OUT_CHANNELS": 256,
    "DEFORM_ON_PER_STAGE": [False, False, False, False],
}
# The MODEL.RESNETS keys of that list that C4 heads (Res5ROIHeads) read to build their res5.
RES5_HEAD_KEYS = ("NUM_GROUPS", "WIDTH_PER_GROUP", "RES2_OUT_CHANNELS")
# Detectron2's ImageNet-pretrained ResNets (what stock configs load): they fit no LambdaResNet.
STOCK_IMAGENET_WEIGHTS = "ImageNetPretrained/"
# fvcore's KeyError for a name that one of detectron2's registries lacks.
_UNKNOWN_REGISTRY_NAME = re.compile(r"No object named '.*' found in '.*' registry!")


def build_detectron2_model(cfg):
    """detectron2's ``build_model(cfg)``, where a name that its registries lack (the config's
    MODEL.META_ARCHITECTURE, MODEL.BACKBONE.NAME, MODEL.ROI_HEADS.NAME, ...) is a
    :class:`UserKeyError` with fvcore's message: the config names it, not the code."""
    try:
        return build_model(cfg)
    except KeyError as error:
        message = str(error.args[0]) if error.args else ""
        if isinstance(error, UserKeyError) or not _UNKNOWN_REGISTRY_NAME.fullmatch(message):
            raise
        raise UserKeyError(message) from error


def backbone_setting(cfg, key: str):
    """``MODEL.LAMBDA_RESNET.<key>``, or for DEPTH, NORM and OUT_FEATURES left None, the
    ``MODEL.RESNETS`` value of the same name."""
    value = cfg.MODEL.LAMBDA_RESNET[key]
    if value is None and key in FOLLOWS_RESNETS:
        return cfg.MODEL.RESNETS[key]
    return value


def _log_settings(cfg) -> None:
    followed = [
        f"{key} {cfg.MODEL.RESNETS[key]!r}"
        for key in FOLLOWS_RESNETS
        if cfg.MODEL.LAMBDA_RESNET[key] is None
    ]
    if followed:
        logger.info("MODEL.LAMBDA_RESNET follows MODEL.RESNETS for %s", ", ".join(followed))
    read_by_heads = RES5_HEAD_KEYS if has_c4_heads(cfg) else ()
    unused = [
        f"{key}={cfg.MODEL.RESNETS[key]!r}"
        for key, default in UNUSED_RESNETS_KEYS.items()
        if key in cfg.MODEL.RESNETS
        and key not in read_by_heads
        and list_or_value(cfg.MODEL.RESNETS[key]) != default
    ]
    if unused:
        logger.warning(
            "a LambdaResNet has no use for MODEL.RESNETS %s (ResNet-RS blocks); they are ignored",
            ", ".join(unused),
        )


def has_c4_heads(cfg) -> bool:
    """Whether the model is an R-CNN whose ROI heads build their own res5 from MODEL.RESNETS
    (detectron2's ``Res5ROIHeads``, or a subclass)."""
    try:
        architecture = META_ARCH_REGISTRY.get(cfg.MODEL.META_ARCHITECTURE)
        heads = ROI_HEADS_REGISTRY.get(cfg.MODEL.ROI_HEADS.NAME)
    except KeyError:  # an unknown name: detectron2 names it when it builds the model
        return False
    return (
        isinstance(architecture, type)
        and issubclass(architecture, GeneralizedRCNN)
        and isinstance(heads, type)
        and issubclass(heads, Res5ROIHeads)
    )


def check_c4_head_channels(cfg, backbone: LambdaResNetBackbone) -> None:
    """C4 heads take ``4 * MODEL.RESNETS.RES2_OUT_CHANNELS`` channels from their input feature;
    a LambdaResNet's res4 has 1024 x ``WIDTH_MULTIPLIER``.

    Raises:
        ValueError: naming the value of MODEL.RESNETS.RES2_OUT_CHANNELS that fits.
    """
    if not has_c4_heads(cfg):
        return
    feature = cfg.MODEL.ROI_HEADS.IN_FEATURES[0]
    if feature not in backbone.output_shape():
        return  # detectron2 names the missing feature
    channels = backbone.output_shape()[feature].channels
    res2_out_channels = cfg.MODEL.RESNETS.RES2_OUT_CHANNELS
    if 4 * res2_out_channels != channels:
        raise UserError(
            f"MODEL.RESNETS.RES2_OUT_CHANNELS {res2_out_channels} gives the C4 heads' res5 "
            f"(Res5ROIHeads) {4 * res2_out_channels} input channels, but the LambdaResNet's "
            f"{feature} has {channels} (MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER "
            f"{cfg.MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER}): set MODEL.RESNETS.RES2_OUT_CHANNELS "
            f"{channels // 4}"
        )


def list_or_value(value):
    return list(value) if isinstance(value, tuple) else value


def lambda_resnet_from_config(cfg, input_shape: ShapeSpec) -> LambdaResNetBackbone:
    """A LambdaResNetBackbone from ``cfg.MODEL.LAMBDA_RESNET`` (DEPTH, NORM and OUT_FEATURES
    left None follow ``MODEL.RESNETS``) and ``cfg.MODEL.BACKBONE.FREEZE_AT``."""
    if "LAMBDA_RESNET" not in cfg.MODEL:
        raise UserKeyError(f"MODEL.LAMBDA_RESNET is missing: {MISSING_CONFIG_HINT}")
    node = cfg.MODEL.LAMBDA_RESNET
    _log_settings(cfg)
    if node.MIXER not in MIXERS:
        raise UserError(
            f"MODEL.LAMBDA_RESNET.MIXER {node.MIXER!r} is not a registered mixer; "
            f"they are {', '.join(repr(name) for name in sorted(MIXERS))}"
        )
    return LambdaResNetBackbone(
        backbone_setting(cfg, "DEPTH"),
        placement=node.PLACEMENT,
        se=node.SE,
        out_features=list(backbone_setting(cfg, "OUT_FEATURES")),
        norm=backbone_setting(cfg, "NORM"),
        freeze_at=cfg.MODEL.BACKBONE.FREEZE_AT,
        width_multiplier=node.WIDTH_MULTIPLIER,
        in_channels=input_shape.channels,
        drop_path_rate=node.DROP_PATH_RATE,
        grad_checkpointing=node.GRAD_CHECKPOINTING,
        mixer=node.MIXER,
        **mixer_options_from_node(node),
    )


def _fpn_in_features(cfg, bottom_up: LambdaResNetBackbone):
    """MODEL.FPN.IN_FEATURES, checked against what the LambdaResNet outputs."""
    in_features = list(cfg.MODEL.FPN.IN_FEATURES)
    outputs = list(backbone_setting(cfg, "OUT_FEATURES"))
    missing = [name for name in in_features if name not in bottom_up.output_shape()]
    if missing:
        key = (
            "MODEL.RESNETS.OUT_FEATURES"
            if cfg.MODEL.LAMBDA_RESNET.OUT_FEATURES is None
            else "MODEL.LAMBDA_RESNET.OUT_FEATURES"
        )
        raise UserError(
            f"MODEL.FPN.IN_FEATURES {in_features} needs {missing}, which "
            f"{key} {outputs} does not output"
        )
    return in_features


@BACKBONE_REGISTRY.register()
def build_lambda_resnet_backbone(cfg, input_shape: ShapeSpec) -> LambdaResNetBackbone:
    """The LambdaResNet alone (e.g. for C4 heads): outputs MODEL.LAMBDA_RESNET.OUT_FEATURES, and
    builds the stages up to the last of them."""
    backbone = lambda_resnet_from_config(cfg, input_shape)
    check_c4_head_channels(cfg, backbone)
    return backbone


def detectron2_fpn(cfg, bottom_up, top_block, in_features) -> FPN:
    """detectron2's FPN over ``bottom_up`` (a LambdaResNet or a timm backbone) with
    ``cfg.MODEL.FPN``'s settings, over ``in_features`` (checked by the caller)."""
    return FPN(
        bottom_up=bottom_up,
        in_features=in_features,
        out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
        norm=cfg.MODEL.FPN.NORM,
        top_block=top_block,
        fuse_type=cfg.MODEL.FPN.FUSE_TYPE,
    )


@BACKBONE_REGISTRY.register()
def build_lambda_resnet_fpn_backbone(cfg, input_shape: ShapeSpec) -> FPN:
    """LambdaResNet + FPN with P6 by max-pooling: the R-CNN family's backbone."""
    bottom_up = lambda_resnet_from_config(cfg, input_shape)
    return detectron2_fpn(cfg, bottom_up, LastLevelMaxPool(), _fpn_in_features(cfg, bottom_up))


@BACKBONE_REGISTRY.register()
def build_retinanet_lambda_resnet_fpn_backbone(cfg, input_shape: ShapeSpec) -> FPN:
    """LambdaResNet + FPN with P6/P7 from res5: RetinaNet's backbone."""
    bottom_up = lambda_resnet_from_config(cfg, input_shape)
    return detectron2_fpn(
        cfg, bottom_up, retinanet_top_block(cfg, bottom_up), _fpn_in_features(cfg, bottom_up)
    )


def retinanet_top_block(cfg, bottom_up) -> LastLevelP6P7:
    """RetinaNet's P6 and P7, from ``bottom_up``'s res5."""
    return LastLevelP6P7(bottom_up.output_shape()["res5"].channels, cfg.MODEL.FPN.OUT_CHANNELS)
