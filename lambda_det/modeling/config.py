"""The backbone's config keys, ``MODEL.LAMBDA_RESNET``, added as a detectron2 project adds its
own (PointRend's ``add_pointrend_config``)::

    cfg = detectron2.config.get_cfg()
    lambda_det.config.add_lambda_det_config(cfg)   # lambda_det's run keys
    add_lambda_resnet_config(cfg)                   # + MODEL.LAMBDA_RESNET

(``lambda_det.run_config.get_cfg()`` does both). Every key is written out in
``_lambda_resnet_node`` with its default and meaning, the built-in mixers' options included; a
mixer registered with ``register_mixer`` gets its keys from its builder
(:mod:`lambda_det.modeling.mixers`). In a LazyConfig recipe, :func:`use_mixer` swaps a mixer's
arguments.
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
    mixer_options_from_config,
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
    # Activation checkpointing: each block's activations are recomputed in backward instead of
    # kept (less memory, about one more forward of compute; BatchNorm statistics update twice).
    node.GRAD_CHECKPOINTING = False
    # The lambda mixer's options (lambda_det.layers.LambdaLayer's defaults; a test keeps them
    # equal): heads |h|, query/key depth |k|, intra-depth |u|.
    node.HEADS = 4
    node.DIM_K = 16
    node.DIM_U = 1
    # Local context |m| = SCOPE x SCOPE (a lambda convolution); 0: global context (scope=None).
    node.SCOPE = 23
    # With SCOPE 0: the largest feature-map side the global position embeddings cover.
    node.MAX_SIZE = 64
    # "einsum" (the paper's form), "conv", "tiled" or "auto": the same outputs and weights.
    node.IMPL = "auto"
    # One relative position embedding for every lambda layer (paper Table 4).
    node.SHARE_POSITION_EMBEDDINGS = False
    # The AFT-conv mixer's options (lambda_det.layers.AFTConv's defaults), with MIXER "aft_conv".
    node.AFT_CONV = CN()
    node.AFT_CONV.HEADS = 8
    node.AFT_CONV.WINDOW_SIZE = 7
    _add_registered_mixer_options(node)
    return node


# The built-in mixers, whose keys _lambda_resnet_node writes out (build.py reads them).
BUILT_IN_MIXERS = ("conv", "lambda", "aft_conv")


def lambda_mixer_options(node: CN) -> dict:
    """The lambda mixer's options from ``MODEL.LAMBDA_RESNET``."""
    return dict(
        heads=node.HEADS,
        dim_k=node.DIM_K,
        dim_u=node.DIM_U,
        scope=node.SCOPE or None,  # 0: global context
        max_size=node.MAX_SIZE,
        impl=node.IMPL,
        share_position_embeddings=node.SHARE_POSITION_EMBEDDINGS,
    )


def aft_conv_mixer_options(node: CN) -> dict:
    """The AFT-conv mixer's options from ``MODEL.LAMBDA_RESNET.AFT_CONV``."""
    return dict(heads=node.AFT_CONV.HEADS, window_size=node.AFT_CONV.WINDOW_SIZE)


def mixer_options_from_node(node: CN) -> dict:
    """The options of the mixer ``MODEL.LAMBDA_RESNET.MIXER`` names, from ``node``: the built-in
    mixers' from their keys above, a registered one's from the node its builder declares."""
    if node.MIXER == "lambda":
        return lambda_mixer_options(node)
    if node.MIXER == "aft_conv":
        return aft_conv_mixer_options(node)
    if node.MIXER == "conv":
        return {}
    return mixer_options_from_config(node.MIXER, node)


def _add_registered_mixer_options(node: CN) -> None:
    """The config keys of every mixer registered with ``register_mixer`` (not the built-in
    ones), with their defaults, in a node its builder declares (lambda_det.modeling.mixers).

    Raises:
        ValueError: a mixer's keys would take a key the node has.
    """
    for name in MIXERS:
        if name in BUILT_IN_MIXERS:
            continue
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
