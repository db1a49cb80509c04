"""Config: the ``MODEL.LAMBDA_RESNET`` node, and detectron2's defaults with it added."""
import functools

from detectron2.config import CfgNode as CN
from detectron2.config import get_cfg as get_detectron2_cfg

__all__ = ["add_lambda_resnet_config", "get_cfg", "MISSING_CONFIG_HINT"]

MISSING_CONFIG_HINT = (
    "this config uses lambda_det's MODEL.LAMBDA_RESNET node, which detectron2's defaults do not "
    "have: call lambda_det.add_lambda_resnet_config(cfg) before merging it, or start from "
    "lambda_det.get_cfg()")


def add_lambda_resnet_config(cfg: CN) -> CN:
    """Add ``MODEL.LAMBDA_RESNET``, ``INPUT.LSJ``, ``DATALOADER.DETERMINISTIC`` and
    ``SOLVER.LOG_PERIOD`` to ``cfg`` in place; returns ``cfg``.

    Idempotent: a node that is already there is left as it is.
    """
    if "LAMBDA_RESNET" not in cfg.MODEL:
        cfg.MODEL.LAMBDA_RESNET = _lambda_resnet_node()
    if "LSJ" not in cfg.INPUT:
        cfg.INPUT.LSJ = _lsj_node()
    # Every iteration a function of (SEED, iteration): bit-exact --resume on the CPU, and the
    # same global batches for any number of processes (lambda_det.engine.deterministic; uniform
    # sampling: SAMPLER_TRAIN and ASPECT_RATIO_GROUPING do not apply).
    if "DETERMINISTIC" not in cfg.DATALOADER:
        cfg.DATALOADER.DETERMINISTIC = False
    # How often the metric writers (metrics.json, the console) run; detectron2 fixes it at 20.
    if "LOG_PERIOD" not in cfg.SOLVER:
        cfg.SOLVER.LOG_PERIOD = 20
    return cfg


def _lambda_resnet_node() -> CN:
    node = CN()
    # One of 26, 50, 101, 152, 200, 270, 350, 420.
    node.DEPTH = 50
    # "paper" (Table 19: listed c4 blocks + all c5), "c4" (all of c4 and c5), "none" (ResNet-RS
    # baseline) or four C/L letters for c2..c5 (Table 12), e.g. "CCLL".
    node.PLACEMENT = "paper"
    # Squeeze-and-excitation (ratio 0.25) in the conv blocks: the "+SE" baselines.
    node.SE = False
    # Lambda layer: heads h, query depth k, intra-depth u, local scope r (odd; 0 = global context).
    # The LambdaLayer's defaults (tests/test_mixers.py checks that they agree).
    node.HEADS = 4
    node.DIM_K = 16
    node.DIM_U = 1
    node.SCOPE = 23
    # Global context only (SCOPE 0): the largest feature-map side the embeddings cover.
    node.MAX_SIZE = 64
    # "auto" (picks by input size and device, measured: docs/benchmarks.md), or one of
    # lambda_det.layers.IMPLEMENTATIONS: "einsum", "conv", "tiled". Same weights in all.
    node.IMPL = "auto"
    # One relative position embedding for all lambda layers (paper Table 4).
    node.SHARE_POSITION_EMBEDDINGS = False
    node.WIDTH_MULTIPLIER = 1.0
    # Backbone norm (detectron2's get_norm names). The paper: synchronized BN, from scratch.
    node.NORM = "BN"
    node.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
    # What PLACEMENT puts in its blocks: "lambda", or "aft_conv" (Attention Free Transformer's
    # conv form, lambda_det.layers.AFTConv) with its own heads and odd window size, or any mixer
    # registered with lambda_det.modeling.register_mixer.
    node.MIXER = "lambda"
    node.AFT_HEADS = 8
    node.AFT_WINDOW_SIZE = 7
    return node


def _lsj_node() -> CN:
    # Large-scale jitter (paper F.3): train on random [MIN_SCALE, MAX_SCALE] x IMAGE_SIZE resizes,
    # cropped or padded to IMAGE_SIZE^2. Training only: the test size is detectron2's
    # INPUT.MIN_SIZE_TEST / MAX_SIZE_TEST (1024 / 1024 in the paper configs).
    lsj = CN()
    lsj.ENABLED = False
    lsj.IMAGE_SIZE = 1024
    lsj.MIN_SCALE = 0.1
    lsj.MAX_SCALE = 2.0
    return lsj


def get_cfg() -> CN:
    """Detectron2's default config plus lambda_det's nodes."""
    return add_lambda_resnet_config(get_detectron2_cfg())


def _with_missing_node_hint(merge):
    @functools.wraps(merge)
    def merge_with_hint(self, *args, **kwargs):
        try:
            return merge(self, *args, **kwargs)
        except (KeyError, AssertionError) as error:  # yacs raises both for unknown keys
            message = str(error.args[0]) if error.args else ""
            if ("LAMBDA_RESNET" in message and MISSING_CONFIG_HINT not in message
                    and "LAMBDA_RESNET" not in self.get("MODEL", {})):
                raise type(error)(f"{message}: {MISSING_CONFIG_HINT}") from error
            raise

    merge_with_hint.__lambda_det_hint__ = True
    return merge_with_hint


def install_missing_node_hint() -> None:
    """Make detectron2's "Non-existent config key: MODEL.LAMBDA_RESNET..." say how to fix it.

    Wraps ``CfgNode.merge_from_file/_other_cfg/_list`` to re-raise that one error with
    :data:`MISSING_CONFIG_HINT` appended; every other behaviour (and every default) is unchanged.
    """
    for method in ("merge_from_file", "merge_from_other_cfg", "merge_from_list"):
        original = getattr(CN, method)
        if not getattr(original, "__lambda_det_hint__", False):
            setattr(CN, method, _with_missing_node_hint(original))
