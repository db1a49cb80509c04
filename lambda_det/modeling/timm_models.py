"""The LambdaResNet family as timm models, to pretrain on ImageNet with timm's tools (the
conversion of such a classifier into weights for the Detectron2 backbone:
:mod:`lambda_det.checkpoint.timm_classifier`).

Importing this module registers, for every depth d of
:data:`~lambda_det.modeling.lambda_resnet.DEPTHS`:

* ``lambda_resnet{d}_det``: LambdaResNet-d (the paper's Table 19 hybrid);
* ``lambda_resnet{d}_c4_det``: lambda layers in every block of c4 and c5 (the "-C4" models);
* ``resnetrs{d}_det`` and ``resnetrs{d}_se_det``: the ResNet-RS twins, without and with SE.

``timm.create_model("lambda_resnet101_det", num_classes=1000)`` builds one; other keyword
arguments go to :class:`~lambda_det.modeling.LambdaResNet` (e.g. ``scope=23``,
``norm="SyncBN"``). Each name has a pretrained cfg in timm's registry (preprocessing, no
weights), and the models keep timm's model contract (docs/ecosystem.md). The state dict has the
backbone's own keys plus ``linear.*`` (the classifier), so the conversion only drops the
classifier and adds the detector's prefix. Needs torch and timm, not detectron2 (docs/timm.md).
"""

import inspect
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from timm.layers import SelectAdaptivePool2d
from timm.models import build_model_with_cfg, checkpoint_seq, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import nn

from lambda_det.modeling.lambda_resnet import DEPTHS, STAGES, LambdaResNet
from lambda_det.modeling.mixers import mixer_options
from lambda_det.utils.errors import UserError

__all__ = ["TimmLambdaResNet", "TIMM_VARIANTS", "PRETRAINED_CFG"]

# name pattern: LambdaResNet keyword arguments
TIMM_VARIANTS = {
    "lambda_resnet{}_det": {"placement": "paper"},
    "lambda_resnet{}_c4_det": {"placement": "c4"},
    "resnetrs{}_det": {"placement": "none"},
    "resnetrs{}_se_det": {"placement": "none", "se": True},
}
# The preprocessing the models are meant to be trained and evaluated with (there are no
# weights): ImageNet statistics, the paper's 224 x 224 (Table 18 trains deeper models at larger
# sizes: pass --img-size to timm's train.py). Registered with timm for every variant.
PRETRAINED_CFG = {
    "url": "",
    "num_classes": 1000,
    "input_size": (3, 224, 224),
    "pool_size": (7, 7),
    "crop_pct": 0.875,
    "interpolation": "bicubic",
    "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225),
    "first_conv": "stem.convs.0",
    "classifier": "linear",
}
# timm.create_model options that timm's builder takes before the model is built.
CREATE_MODEL_OPTIONS = (
    "features_only",
    "out_indices",
    "feature_cls",
    "feature_cfg",
    "pretrained_cfg",
    "pretrained_cfg_overlay",
    "scriptable",
    "exportable",
)
TIMM_ARGUMENTS = ("num_classes", "in_chans", "drop_rate", "drop_path_rate", "global_pool")
# LambdaResNet arguments that the timm model sets itself (from TIMM_ARGUMENTS).
_SET_FROM_TIMM = ("num_classes", "in_channels", "drop_path_rate", "out_features")


def check_model_arguments(kwargs: Dict) -> None:
    """A TypeError naming each keyword that neither LambdaResNet nor its mixer takes, and where
    it would be valid."""
    backbone = [
        name
        for name in inspect.signature(LambdaResNet).parameters
        if name not in ("depth", "options") + _SET_FROM_TIMM
    ]
    mixer = kwargs.get("mixer", "lambda")
    options = [name for name in mixer_options(mixer) if name not in backbone]
    unknown = sorted(set(kwargs) - set(backbone) - set(options))
    if not unknown:
        return
    places = []
    for name in unknown:
        if name in _SET_FROM_TIMM:
            places.append(
                f"{name!r} is set from timm's arguments (in_chans, num_classes, drop_path_rate)"
            )
        elif name in CREATE_MODEL_OPTIONS:
            places.append(f"{name!r} is an option of timm.create_model, not of the model class")
        else:
            places.append(f"{name!r} is not an option of these models")
    raise TypeError(
        f"unknown keyword argument(s) {unknown} for a lambda_det timm model: "
        f"{'; '.join(places)}. They take timm's {TIMM_ARGUMENTS}, LambdaResNet's {tuple(backbone)}"
        f" and the {mixer!r} mixer's options {tuple(options)}"
    )


class TimmLambdaResNet(LambdaResNet):
    """A LambdaResNet classifier with timm's model interface, for timm's training, validation
    and feature extraction: ``forward`` returns logits (pooled features with
    ``num_classes=0``, the unpooled map with ``global_pool=""`` too), and ``forward_features``,
    ``forward_head``, ``forward_intermediates``, ``prune_intermediate_layers``,
    ``get_classifier``, ``reset_classifier``, ``set_grad_checkpointing``, ``feature_info``,
    ``num_features`` and ``head_hidden_size`` follow timm's ResNet.

    Args:
        num_classes, in_chans, drop_rate (dropout before the classifier), drop_path_rate
            (stochastic depth, see :class:`LambdaResNet`), global_pool (any pool timm's
            SelectAdaptivePool2d takes; "catavgmax" doubles the classifier's inputs): timm's
            names.
        **kwargs: :class:`LambdaResNet` arguments and its mixer's options.
    """

    def __init__(
        self,
        depth: int,
        *,
        num_classes: int = 1000,
        in_chans: int = 3,
        drop_rate: float = 0.0,
        global_pool: str = "avg",
        drop_path_rate: Optional[float] = None,
        **kwargs,
    ):
        check_model_arguments(kwargs)
        _check_head(num_classes, global_pool)
        # num_classes=0: no classifier (LambdaResNet makes one for any count that is not None).
        super().__init__(
            depth,
            num_classes=num_classes or None,
            in_channels=in_chans,
            drop_path_rate=drop_path_rate or 0.0,
            **kwargs,
        )
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.num_features = self.head_hidden_size = self._out_feature_channels["res5"]
        self.feature_info = [
            dict(
                num_chs=self._out_feature_channels[name],
                reduction=self._out_feature_strides[name],
                module=name,
            )
            for name in ("stem",) + STAGES
        ]
        self.global_pool = global_pool
        self.avgpool = _pool(global_pool)
        if not num_classes:
            self.linear = nn.Identity()
        elif self.avgpool.feat_mult() != 1:  # e.g. "catavgmax": the classifier takes 2 C
            self.linear = nn.Linear(self.num_features * self.avgpool.feat_mult(), num_classes)
            nn.init.normal_(self.linear.weight, std=0.01)
            nn.init.zeros_(self.linear.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq([self.res2, self.res3, self.res4, self.res5], x, flatten=True)
        return self.res5(self.res4(self.res3(self.res2(x))))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.avgpool(x)
        if self.drop_rate:
            x = F.dropout(x, p=float(self.drop_rate), training=self.training)
        return x if pre_logits else self.linear(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: Optional[Union[int, List[int]]] = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """The outputs of the stem and of each stage (feature_info order), as timm's ResNet.

        Args:
            indices: of feature_info: the last n if an int, all if None, or these (negative
                from the end).
            norm: no effect (no final norm).
            stop_early: stop after the last stage asked for (the returned features are then
                that stage's output).
            output_fmt: "NCHW" only.
            intermediates_only: return the intermediates alone.
        """
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        take, last = feature_take_indices(len(self.feature_info), indices)
        intermediates = []
        x = self.stem(x)
        if 0 in take:
            intermediates.append(x)
        for index, name in enumerate(STAGES[:last] if stop_early else STAGES, start=1):
            stage = getattr(self, name)
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint_seq(stage, x)
            else:
                x = stage(x)
            if index in take:
                intermediates.append(x)
        return intermediates if intermediates_only else (x, intermediates)

    def prune_intermediate_layers(
        self, indices: Union[int, List[int]] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> List[int]:
        """Drop the stages after the last of ``indices`` (and the head): for features only."""
        take, last = feature_take_indices(len(self.feature_info), indices)
        for name in STAGES[last:]:
            setattr(self, name, nn.Identity())
        if prune_head:
            self.reset_classifier(0, "")
        return take

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in backward instead of keeping them."""
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        """Regexes over parameter names that group them for timm's layer-wise learning rate
        decay (``param_groups_layer_decay``): the stem, then each stage (coarse) or block."""
        return dict(stem=r"^stem", blocks=r"^res(\d+)" if coarse else r"^res(\d+)\.(\d+)")

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.linear

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A new classifier for ``num_classes`` (0: none, ``forward`` returns the pooled
        features), and the pool ``global_pool`` if given ("": none, with num_classes=0)."""
        global_pool = self.global_pool if global_pool is None else global_pool
        _check_head(num_classes, global_pool)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.avgpool = _pool(global_pool)
        features = self.num_features * self.avgpool.feat_mult()
        self.linear = nn.Linear(features, num_classes) if num_classes else nn.Identity()


def _pool(global_pool: str) -> SelectAdaptivePool2d:
    """timm's global pool of that name, flattened ("" keeps the map), as timm's ResNet has."""
    return SelectAdaptivePool2d(pool_type=global_pool, flatten=bool(global_pool))


def _check_head(num_classes: int, global_pool: str) -> None:
    try:
        _pool(global_pool)
    except (AssertionError, AttributeError):  # timm asserts; a non-string has no .lower()
        raise ValueError(
            f"global_pool must be a pool timm's SelectAdaptivePool2d takes ("
            f"'avg', 'max', 'avgmax', 'catavgmax', their 'fast' forms, or '' for "
            f"none), got {global_pool!r}"
        ) from None
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 0:
        raise ValueError(f"num_classes must be an integer >= 0, got {num_classes!r}")
    if num_classes and not global_pool:
        raise ValueError(
            f"global_pool='' (no pooling) needs num_classes=0: a classifier takes "
            f"pooled features, got num_classes={num_classes}"
        )


def _create(
    name: str, pretrained: bool, depth: int, kwargs: Dict[str, Any], **variant
) -> TimmLambdaResNet:
    """The model registered as ``name``: LambdaResNet-``depth`` with the variant's arguments,
    which ``kwargs`` (timm.create_model's) override."""
    if pretrained:
        raise UserError(f"no pretrained weights exist for {name}: train it (pretrained=False)")
    return build_model_with_cfg(
        TimmLambdaResNet, name, pretrained, depth=depth, **{**variant, **kwargs}
    )


# timm's register_model picks up the pretrained cfg of each name from here.
default_cfgs = generate_default_cfgs(
    {pattern.format(depth): dict(PRETRAINED_CFG) for pattern in TIMM_VARIANTS for depth in DEPTHS}
)

# The models, one entrypoint per name as timm's own model files have them: TIMM_VARIANTS at every
# depth of DEPTHS (tests/modeling/test_timm.py checks that they match).


# LambdaResNets: lambda layers where the paper's Table 19 hybrids have them.
@register_model
def lambda_resnet26_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet26_det", pretrained, 26, kwargs, placement="paper")


@register_model
def lambda_resnet50_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet50_det", pretrained, 50, kwargs, placement="paper")


@register_model
def lambda_resnet101_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet101_det", pretrained, 101, kwargs, placement="paper")


@register_model
def lambda_resnet152_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet152_det", pretrained, 152, kwargs, placement="paper")


@register_model
def lambda_resnet200_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet200_det", pretrained, 200, kwargs, placement="paper")


@register_model
def lambda_resnet270_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet270_det", pretrained, 270, kwargs, placement="paper")


@register_model
def lambda_resnet350_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet350_det", pretrained, 350, kwargs, placement="paper")


@register_model
def lambda_resnet420_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet420_det", pretrained, 420, kwargs, placement="paper")


# Lambda layers in every block of c4 and c5: the paper's "-C4" models.
@register_model
def lambda_resnet26_c4_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet26_c4_det", pretrained, 26, kwargs, placement="c4")


@register_model
def lambda_resnet50_c4_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet50_c4_det", pretrained, 50, kwargs, placement="c4")


@register_model
def lambda_resnet101_c4_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet101_c4_det", pretrained, 101, kwargs, placement="c4")


@register_model
def lambda_resnet152_c4_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet152_c4_det", pretrained, 152, kwargs, placement="c4")


@register_model
def lambda_resnet200_c4_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet200_c4_det", pretrained, 200, kwargs, placement="c4")


@register_model
def lambda_resnet270_c4_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet270_c4_det", pretrained, 270, kwargs, placement="c4")


@register_model
def lambda_resnet350_c4_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet350_c4_det", pretrained, 350, kwargs, placement="c4")


@register_model
def lambda_resnet420_c4_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("lambda_resnet420_c4_det", pretrained, 420, kwargs, placement="c4")


# The ResNet-RS twins.
@register_model
def resnetrs26_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs26_det", pretrained, 26, kwargs, placement="none")


@register_model
def resnetrs50_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs50_det", pretrained, 50, kwargs, placement="none")


@register_model
def resnetrs101_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs101_det", pretrained, 101, kwargs, placement="none")


@register_model
def resnetrs152_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs152_det", pretrained, 152, kwargs, placement="none")


@register_model
def resnetrs200_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs200_det", pretrained, 200, kwargs, placement="none")


@register_model
def resnetrs270_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs270_det", pretrained, 270, kwargs, placement="none")


@register_model
def resnetrs350_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs350_det", pretrained, 350, kwargs, placement="none")


@register_model
def resnetrs420_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs420_det", pretrained, 420, kwargs, placement="none")


# The ResNet-RS twins with squeeze-and-excitation (the "+SE" baselines).
@register_model
def resnetrs26_se_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs26_se_det", pretrained, 26, kwargs, placement="none", se=True)


@register_model
def resnetrs50_se_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs50_se_det", pretrained, 50, kwargs, placement="none", se=True)


@register_model
def resnetrs101_se_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs101_se_det", pretrained, 101, kwargs, placement="none", se=True)


@register_model
def resnetrs152_se_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs152_se_det", pretrained, 152, kwargs, placement="none", se=True)


@register_model
def resnetrs200_se_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs200_se_det", pretrained, 200, kwargs, placement="none", se=True)


@register_model
def resnetrs270_se_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs270_se_det", pretrained, 270, kwargs, placement="none", se=True)


@register_model
def resnetrs350_se_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs350_se_det", pretrained, 350, kwargs, placement="none", se=True)


@register_model
def resnetrs420_se_det(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
    return _create("resnetrs420_se_det", pretrained, 420, kwargs, placement="none", se=True)
