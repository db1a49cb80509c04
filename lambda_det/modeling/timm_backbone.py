"""timm's image models as detectron2 backbones: its ImageNet-pretrained lambda networks
(``lambda_resnet26t.c1_in1k``, ``lambda_resnet50ts.a1h_in1k``) or any timm model with
``forward_intermediates``, alone, under an FPN, or under RetinaNet's FPN::

    MODEL.BACKBONE.NAME build_timm_fpn_backbone
    MODEL.TIMM.NAME lambda_resnet26t.c1_in1k
    MODEL.WEIGHTS timm://lambda_resnet26t.c1_in1k    # timm's ImageNet weights

The features are timm's own (``forward_intermediates``, the tensors its ``features_only`` model
gives), named as detectron2 names a ResNet's by their stride: ``res{k}`` at stride 2**k (``res2``
at 4 ... ``res5`` at 32), with the channels and strides of timm's ``feature_info``. The model
keeps timm's parameter names (``backbone.bottom_up.model.<timm name>``), so a timm state dict
is the backbone's weights with a prefix: the checkpointer loads ``MODEL.WEIGHTS`` (a
``timm://NAME`` from timm's hub cache, or a local file of timm's; see
:mod:`lambda_det.checkpoint.timm_weights`). The builders load no weights themselves.

Needs timm (``pip install timm``) when a timm backbone is built.
"""

import math
from typing import Dict, List, Sequence

import torch
from detectron2.layers import ShapeSpec
from detectron2.modeling import BACKBONE_REGISTRY, FPN, Backbone
from detectron2.modeling.backbone.fpn import LastLevelMaxPool
from torch import nn

from lambda_det.modeling.build import detectron2_fpn, retinanet_top_block
from lambda_det.utils.errors import UserError

__all__ = [
    "TimmBackbone",
    "TIMM_NORMS",
    "build_timm_backbone",
    "build_timm_fpn_backbone",
    "build_retinanet_timm_fpn_backbone",
    "timm_feature_names",
]

# MODEL.TIMM.NORM: what the model's BatchNorms become. "FrozenBN" (detectron2's choice for
# fine-tuning ImageNet weights), "BN" (left as timm builds them), "SyncBN" (torch's
# SyncBatchNorm), "naiveSyncBN" (what lambda_det makes of SyncBN on the CPU: plain BN in one
# process; timm's fused norm-and-activation layers have no other synchronised form).
TIMM_NORMS = ("FrozenBN", "BN", "SyncBN", "naiveSyncBN")


def import_timm():
    try:
        import timm
    except ImportError:
        raise ImportError(
            "timm backbones need timm: pip install timm (or pip install -e '.[dev]')"
        ) from None
    return timm


def timm_feature_names(feature_info: Sequence[dict]) -> Dict[str, int]:
    """detectron2's name of each feature of timm's ``feature_info``, ``res{k}`` for stride 2**k,
    mapped to its index; of two features at one stride, the deeper one."""
    names = {}
    for index, info in enumerate(feature_info):
        stride = info["reduction"]
        if stride >= 2 and stride & (stride - 1) == 0:  # a power of 2
            names[f"res{int(math.log2(stride))}"] = index
    return names


def _frozen_parameters(model: nn.Module, stage_modules: List[str], freeze_at: int) -> List[str]:
    """The names of the parameters ``freeze_at`` freezes, as detectron2's FREEZE_AT counts: 1
    the stem (every module before res2's), k >= 2 the stem and res2 ... res{k} (every module up
    to the end of res{k}'s). timm registers modules in forward order, so ``named_modules`` walks
    them in that order."""
    if freeze_at <= 0:
        return []
    last = stage_modules[0] if freeze_at == 1 else stage_modules[freeze_at - 2]
    frozen, reached = [], False
    for name, module in model.named_modules():
        within = name == last or name.startswith(last + ".")
        if (freeze_at == 1 and within) or (reached and not within):
            break
        reached = reached or within
        frozen += [
            f"{name}.{key}" if name else key for key, _ in module.named_parameters(recurse=False)
        ]
    return frozen


def _freeze_batch_norms(model: nn.Module, frozen: set, timm) -> None:
    """timm's frozen BatchNorm (norm-and-activation layers stay fused) for every BatchNorm all of
    whose parameters are in ``frozen``, in place."""
    for name, module in list(model.named_modules()):
        if not isinstance(module, (nn.BatchNorm2d, nn.SyncBatchNorm)):
            continue
        parameters = [f"{name}.{key}" for key, _ in module.named_parameters()]
        if parameters and all(parameter in frozen for parameter in parameters):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            parent.add_module(child, timm.layers.freeze_batch_norm_2d(module))


class TimmBackbone(Backbone):
    """A timm model as a detectron2 ``Backbone``: ``forward(images)`` returns the features
    ``out_features`` names (``res2`` ... ``res5``; :func:`timm_feature_names`).

    Args:
        model_name: a timm model, with or without a pretrained tag
            (``lambda_resnet26t.c1_in1k``); built without weights.
        out_features: the features to output; the layers after the last of them are removed.
        freeze_at: detectron2's MODEL.BACKBONE.FREEZE_AT: 0 trains everything, 1 freezes the
            stem, k >= 2 the stem and res2 ... res{k} (their BatchNorms become frozen ones).
        norm: one of :data:`TIMM_NORMS`.
        grad_checkpointing: timm's activation checkpointing (``set_grad_checkpointing``):
            recompute the stages' activations in backward instead of keeping them.
        in_channels: image channels.
    """

    def __init__(
        self,
        model_name: str,
        out_features: Sequence[str] = ("res2", "res3", "res4", "res5"),
        *,
        freeze_at: int = 0,
        norm: str = "FrozenBN",
        grad_checkpointing: bool = False,
        in_channels: int = 3,
    ):
        super().__init__()
        timm = import_timm()
        if not timm.is_model(model_name):
            lambda_models = ", ".join(timm.list_models("*lambda*", pretrained=True))
            raise UserError(
                f"MODEL.TIMM.NAME {model_name!r} is not a timm model: pass one of "
                f"timm.list_models(pretrained=True), e.g. {lambda_models}"
            )
        if norm not in TIMM_NORMS:
            raise UserError(
                f"MODEL.TIMM.NORM {norm!r} is not one of {', '.join(TIMM_NORMS)}: pass "
                f"FrozenBN to fine-tune ImageNet weights, BN or SyncBN to train the norms"
            )
        model = timm.create_model(model_name, pretrained=False, in_chans=in_channels)
        if model.pretrained_cfg.get("fixed_input_size"):
            size = model.pretrained_cfg["input_size"][1:]
            raise UserError(
                f"timm model {model_name!r} takes only {size[0]} x {size[1]} images (its "
                f"position embeddings have a fixed size), and detectron2 feeds images of any "
                f"size: pick a model without a fixed size, e.g. lambda_resnet26t.c1_in1k or "
                f"lambda_resnet50ts.a1h_in1k"
            )
        names = timm_feature_names(model.feature_info)
        stages = [name for name in names if int(name[3:]) >= 2]  # res2 ...: FREEZE_AT's units
        unknown = [name for name in out_features if name not in names]
        if unknown or not out_features:
            raise UserError(
                f"MODEL.TIMM.OUT_FEATURES {list(out_features)}: {model_name} has the features "
                f"{', '.join(names)} (detectron2's names for strides "
                f"{', '.join(str(2 ** int(n[3:])) for n in names)}); pick from those"
            )
        if not 0 <= freeze_at <= len(stages) + 1:
            raise UserError(
                f"MODEL.BACKBONE.FREEZE_AT {freeze_at} is beyond {model_name}'s stages "
                f"({', '.join(stages)}): pass 0 (train all), 1 (the stem) or k from 2 to "
                f"{len(stages) + 1} (the stem and {stages[0]} ... res{{k}})"
            )
        self._out_features = sorted(out_features, key=lambda name: names[name])
        self._indices = [names[name] for name in self._out_features]
        model.prune_intermediate_layers(self._indices, prune_head=True)
        info = model.feature_info
        self._out_feature_channels = {n: info[names[n]]["num_chs"] for n in self._out_features}
        self._out_feature_strides = {n: info[names[n]]["reduction"] for n in self._out_features}
        self.model_name = model_name
        self.pretrained_cfg = dict(model.pretrained_cfg)

        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if norm == "naiveSyncBN" and distributed and torch.distributed.get_world_size() > 1:
            raise UserError(
                "MODEL.TIMM.NORM naiveSyncBN (SyncBN on the CPU) is not synchronised across "
                "processes for timm models: pass FrozenBN or BN, or train on GPUs with SyncBN"
            )
        if norm == "FrozenBN":
            model = timm.layers.freeze_batch_norm_2d(model)
        elif norm == "SyncBN":
            model = timm.layers.convert_sync_batchnorm(model)
        stage_modules = [info[names[name]]["module"] for name in stages]
        frozen = set(_frozen_parameters(model, stage_modules, freeze_at))
        for name, parameter in model.named_parameters():
            if name in frozen:
                parameter.requires_grad_(False)
        _freeze_batch_norms(model, frozen, timm)
        model.set_grad_checkpointing(grad_checkpointing)
        self.model = model

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        features = self.model.forward_intermediates(
            x, indices=self._indices, intermediates_only=True
        )
        return dict(zip(self._out_features, features))

    def output_shape(self) -> Dict[str, ShapeSpec]:
        return {
            name: ShapeSpec(
                channels=self._out_feature_channels[name], stride=self._out_feature_strides[name]
            )
            for name in self._out_features
        }


def timm_backbone_from_config(cfg, input_shape: ShapeSpec) -> TimmBackbone:
    """A TimmBackbone from ``cfg.MODEL.TIMM`` and ``cfg.MODEL.BACKBONE.FREEZE_AT``."""
    if "TIMM" not in cfg.MODEL or not cfg.MODEL.TIMM.NAME:
        raise UserError(
            f"MODEL.BACKBONE.NAME {cfg.MODEL.BACKBONE.NAME} needs MODEL.TIMM.NAME, a timm "
            f"model such as lambda_resnet26t.c1_in1k (lambda_det.run_config.get_cfg() has "
            f"the MODEL.TIMM keys)"
        )
    node = cfg.MODEL.TIMM
    return TimmBackbone(
        node.NAME,
        node.OUT_FEATURES,
        freeze_at=cfg.MODEL.BACKBONE.FREEZE_AT,
        norm=node.NORM,
        grad_checkpointing=node.GRAD_CHECKPOINTING,
        in_channels=input_shape.channels,
    )


def _fpn_in_features(cfg, bottom_up: TimmBackbone) -> list:
    """MODEL.FPN.IN_FEATURES, checked against what the timm backbone outputs."""
    in_features = list(cfg.MODEL.FPN.IN_FEATURES)
    missing = [name for name in in_features if name not in bottom_up.output_shape()]
    if not in_features:
        raise UserError(
            f"MODEL.FPN.IN_FEATURES is empty: name the features the FPN takes, e.g. "
            f"{list(bottom_up.output_shape())}"
        )
    if missing:
        raise UserError(
            f"MODEL.FPN.IN_FEATURES {in_features} needs {missing}, which "
            f"MODEL.TIMM.OUT_FEATURES {list(cfg.MODEL.TIMM.OUT_FEATURES)} does not output"
        )
    return in_features


@BACKBONE_REGISTRY.register()
def build_timm_backbone(cfg, input_shape: ShapeSpec) -> TimmBackbone:
    """The timm model alone: outputs MODEL.TIMM.OUT_FEATURES."""
    return timm_backbone_from_config(cfg, input_shape)


@BACKBONE_REGISTRY.register()
def build_timm_fpn_backbone(cfg, input_shape: ShapeSpec) -> FPN:
    """The timm model + FPN with P6 by max-pooling: the R-CNN family's backbone."""
    bottom_up = timm_backbone_from_config(cfg, input_shape)
    return detectron2_fpn(cfg, bottom_up, LastLevelMaxPool(), _fpn_in_features(cfg, bottom_up))


@BACKBONE_REGISTRY.register()
def build_retinanet_timm_fpn_backbone(cfg, input_shape: ShapeSpec) -> FPN:
    """The timm model + FPN with P6/P7 from res5: RetinaNet's backbone."""
    bottom_up = timm_backbone_from_config(cfg, input_shape)
    return detectron2_fpn(
        cfg, bottom_up, retinanet_top_block(cfg, bottom_up), _fpn_in_features(cfg, bottom_up)
    )
