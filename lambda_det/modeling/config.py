"""The backbone's config keys, ``MODEL.LAMBDA_RESNET``, added as a detectron2 project adds its
own (PointRend's ``add_pointrend_config``)::

    cfg = detectron2.config.get_cfg()
    lambda_det.config.add_lambda_det_config(cfg)   # lambda_det's run keys
    add_lambda_resnet_config(cfg)                   # + MODEL.LAMBDA_RESNET

(``lambda_det.run_config.get_cfg()`` does both). The keys of every registered mixer's options
come from its builder (:mod:`lambda_det.modeling.mixers`); in a LazyConfig recipe,
:func:`use_mixer` swaps a mixer's arguments.
"""

import inspect
from typing import MutableMapping

from detectron2.config import CfgNode as CN

from lambda_det.modeling.lambda_resnet import LambdaResNet
from lambda_det.modeling.mixers import (
    MIXERS,
    check_mixer_options,
    mixer_config_defaults,
    mixer_config_node,
    mixer_option_defaults,
)
from lambda_det.utils.errors import UserError

__all__ = [
    "add_lambda_resnet_config",
    "add_timm_backbone_config",
    "register_renamed_keys",
    "use_mixer",
    "RENAMED_KEYS",
]

# Keys that moved, and where to: a config that sets one gets an error naming the key to set
# (yacs' renamed keys); a saved config that has one compares as if it had the new key.
RENAMED_KEYS = {
    "MODEL.LAMBDA_RESNET.AFT_HEADS": "MODEL.LAMBDA_RESNET.AFT_CONV.HEADS",
    "MODEL.LAMBDA_RESNET.AFT_WINDOW_SIZE": "MODEL.LAMBDA_RESNET.AFT_CONV.WINDOW_SIZE",
}


def add_lambda_resnet_config(cfg: CN) -> CN:
    """Add ``MODEL.LAMBDA_RESNET`` (docs/config.md lists its keys) to ``cfg`` in place, and its
    :data:`RENAMED_KEYS`; returns ``cfg``.

    Idempotent: a node that is already there is left as it is.
    """
    if "LAMBDA_RESNET" not in cfg.MODEL:
        cfg.MODEL.LAMBDA_RESNET = _lambda_resnet_node()
    register_renamed_keys(cfg)
    return cfg


def add_timm_backbone_config(cfg: CN) -> CN:
    """Add ``MODEL.TIMM``, the keys of the timm backbones (lambda_det.modeling.timm_backbone),
    to ``cfg`` in place; returns ``cfg``. Idempotent."""
    if "TIMM" not in cfg.MODEL:
        node = CN()
        # A timm model with its pretrained tag, e.g. "lambda_resnet26t.c1_in1k"; its ImageNet
        # weights: MODEL.WEIGHTS "timm://lambda_resnet26t.c1_in1k" (timm's hub cache).
        node.NAME = ""
        # detectron2's names for the features by stride: res2 (4) ... res5 (32).
        node.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
        # What the model's BatchNorms become: "FrozenBN" (fine-tuning), "BN" or "SyncBN".
        node.NORM = "FrozenBN"
        # Activation checkpointing (timm's set_grad_checkpointing): less memory, more compute.
        node.GRAD_CHECKPOINTING = False
        cfg.MODEL.TIMM = node
    return cfg


def register_renamed_keys(cfg: CN) -> None:
    """yacs' renamed keys of :data:`RENAMED_KEYS` on ``cfg`` (a copy of a config keeps the keys,
    not yacs' list of renamed ones)."""
    for old, new in RENAMED_KEYS.items():
        if not cfg.key_is_renamed(old):
            cfg.register_renamed_key(old, new)


def _lambda_resnet_node() -> CN:
    node = CN()
    # One of lambda_det.modeling.lambda_resnet.DEPTHS. DEPTH, NORM and OUT_FEATURES left None take
    # MODEL.RESNETS.DEPTH / NORM / OUT_FEATURES, so a stock config keeps its meaning when only
    # MODEL.BACKBONE.NAME changes.
    node.DEPTH = None
    # "paper" (Table 19: listed c4 blocks + all c5), "c4" (all of c4 and c5), "none" (ResNet-RS
    # baseline) or four C/L letters for c2..c5 (Table 12), e.g. "CCLL".
    node.PLACEMENT = "paper"
    # Squeeze-and-excitation (ratio 0.25) in the conv blocks: the "+SE" baselines.
    node.SE = False
    node.WIDTH_MULTIPLIER = 1.0
    # Stochastic depth, the largest block's rate (linear in block order, Huang et al. 2016).
    # The paper's detection recipe uses none; its ImageNet recipe does (Table 20).
    node.DROP_PATH_RATE = 0.0
    # Backbone norm (detectron2's get_norm names). The paper: synchronized BN, from scratch.
    node.NORM = None
    node.OUT_FEATURES = None
    # What PLACEMENT puts in its blocks: "lambda", or "aft_conv" (Attention Free Transformer's
    # conv form, lambda_det.layers.AFTConv), or any mixer registered with
    # lambda_det.modeling.register_mixer.
    node.MIXER = "lambda"
    # Compile the backbone with torch.compile for training (LSJ crops give one input size).
    node.COMPILE = False
    _add_mixer_options(node)
    return node


def _add_mixer_options(node: CN) -> None:
    """The config keys of every registered mixer's options, with their defaults, as its builder
    declares them (lambda_det.modeling.mixers): the lambda mixer's in the backbone's node
    (HEADS, DIM_K, DIM_U, SCOPE, MAX_SIZE, IMPL, SHARE_POSITION_EMBEDDINGS), another's in a node
    of its name (AFT_CONV.HEADS, AFT_CONV.WINDOW_SIZE).

    Raises:
        ValueError: a mixer's keys would take a key the node has.
    """
    for name in MIXERS:
        defaults = mixer_config_defaults(name)
        if not defaults:
            continue
        where = mixer_config_node(name)
        if where:
            if where in node:
                raise UserError(
                    f"mixer {name!r} puts its options under MODEL.LAMBDA_RESNET."
                    f"{where}, which is taken: register it under another name"
                )
            node[where] = CN()
        section = node[where] if where else node
        for key, default in defaults.items():
            if key in section:
                raise UserError(
                    f"mixer {name!r} option {key.lower()!r} would be MODEL."
                    f"LAMBDA_RESNET.{key}, which is taken: put its options in a "
                    f"node of their own (CONFIG_NODE)"
                )
            section[key] = default


def use_mixer(arguments: MutableMapping, name: str, **options) -> None:
    """Make the LazyConfig arguments of a LambdaResNet (a recipe's ``model.backbone.bottom_up``)
    use the mixer registered under ``name``, in place: the options of the mixer they name go,
    the new mixer's come with their defaults
    (:func:`lambda_det.modeling.mixers.mixer_option_defaults`), updated with ``options``.

    Raises:
        ValueError: an unknown mixer.
        TypeError: options the mixer does not take.
    """
    check_mixer_options(name, options)
    current = arguments.get("mixer", inspect.signature(LambdaResNet).parameters["mixer"].default)
    for option in mixer_option_defaults(current):
        arguments.pop(option, None)
    arguments.update(mixer=name, **{**mixer_option_defaults(name), **options})
