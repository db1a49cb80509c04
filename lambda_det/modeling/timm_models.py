"""The LambdaResNet family as timm models, to pretrain on ImageNet with timm's tools, and the
conversion of such a classifier into weights for the Detectron2 backbone.

Importing this module registers, for every depth d in 26, 50, 101, 152, 200, 270, 350, 420:

* ``lambda_resnet{d}_det``: LambdaResNet-d (the paper's Table 19 hybrid);
* ``lambda_resnet{d}_c4_det``: lambda layers in every block of c4 and c5 (the "-C4" models);
* ``resnetrs{d}_det`` and ``resnetrs{d}_se_det``: the ResNet-RS twins, without and with SE.

``timm.create_model("lambda_resnet101_det", num_classes=1000)`` builds one; other keyword
arguments go to :class:`~lambda_det.modeling.LambdaResNet` (e.g. ``scope=23``,
``norm="SyncBN"``). The state dict has the backbone's own keys plus ``linear.*`` (the classifier),
so :func:`convert_classifier_checkpoint` only drops the classifier and adds the detector's
prefix. Needs timm (``pip install timm``).
"""
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from timm.models import register_model
from lambda_det.modeling.lambda_resnet import BLOCKS_PER_STAGE, STAGES, LambdaResNet

__all__ = ["TimmLambdaResNet", "convert_classifier_checkpoint", "TIMM_VARIANTS"]

# name pattern: LambdaResNet keyword arguments
TIMM_VARIANTS = {
    "lambda_resnet{}_det": {"placement": "paper"},
    "lambda_resnet{}_c4_det": {"placement": "c4"},
    "resnetrs{}_det": {"placement": "none"},
    "resnetrs{}_se_det": {"placement": "none", "se": True},
}
# timm's preprocessing defaults for these models: ImageNet statistics, the paper's 224 x 224
# (Table 18 trains deeper models at larger sizes: pass --img-size to timm's train.py).
PRETRAINED_CFG = {"input_size": (3, 224, 224), "pool_size": (7, 7), "crop_pct": 0.875,
                  "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406),
                  "std": (0.229, 0.224, 0.225), "first_conv": "stem.convs.0", "classifier": "linear"}


class TimmLambdaResNet(LambdaResNet):
    """A LambdaResNet classifier with timm's model interface: ``forward`` returns logits, and
    ``forward_features``, ``forward_head``, ``get_classifier``, ``reset_classifier``,
    ``num_features`` and ``pretrained_cfg`` are there for timm's training and validation scripts.

    Args:
        num_classes, in_chans, drop_rate (dropout before the classifier), drop_path_rate
            (stochastic depth, see :class:`LambdaResNet`), global_pool ("avg"): timm's names.
        **kwargs: :class:`LambdaResNet` arguments.
    """

    def __init__(self, depth: int, *, num_classes: int = 1000, in_chans: int = 3,
                 drop_rate: float = 0.0, global_pool: str = "avg",
                 drop_path_rate: Optional[float] = None, **kwargs):
        if global_pool != "avg":
            raise ValueError(f"global_pool must be 'avg', got {global_pool!r}")
        super().__init__(depth, num_classes=num_classes, in_channels=in_chans,
                         drop_path_rate=drop_path_rate or 0.0, **kwargs)
        self.drop_rate = drop_rate
        self.num_features = self.linear.in_features
        self.pretrained_cfg = dict(PRETRAINED_CFG, num_classes=num_classes)
        self.default_cfg = self.pretrained_cfg

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for name in STAGES:
            x = getattr(self, name)(x)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = torch.flatten(self.avgpool(x), 1)
        if self.drop_rate:
            x = F.dropout(x, p=self.drop_rate, training=self.training)
        return x if pre_logits else self.linear(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.linear

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        self.linear = nn.Linear(self.num_features, num_classes)


def _entrypoint(name: str, depth: int, variant: dict):
    def create(pretrained: bool = False, **kwargs) -> TimmLambdaResNet:
        if pretrained:
            raise ValueError(f"no pretrained weights exist for {name}: train it (pretrained=False)")
        for timm_only in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
            kwargs.pop(timm_only, None)
        return TimmLambdaResNet(depth, **{**variant, **kwargs})

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = f"{name}: LambdaResNet-{depth} {variant} for timm."
    return create


for _pattern, _variant in TIMM_VARIANTS.items():
    for _depth in BLOCKS_PER_STAGE:
        _name = _pattern.format(_depth)
        globals()[_name] = register_model(_entrypoint(_name, _depth, _variant))


def convert_classifier_checkpoint(checkpoint: Dict, model: nn.Module, use_ema: bool = False
                                  ) -> Dict[str, torch.Tensor]:
    """The backbone weights of a timm classifier checkpoint, named as in ``model`` (a detector
    built from the config to fine-tune, e.g. on the meta device: only names and shapes are used).

    Args:
        checkpoint: as :func:`lambda_det.engine.load_checkpoint_file` reads a timm file:
            ``state_dict`` (and ``state_dict_ema``) from timm's train.py, or a bare state dict.
        use_ema: take the exponential moving average of the weights (timm's ``--model-ema``).

    Raises:
        ValueError: the checkpoint is not a classifier of the config's backbone (another depth,
            placement, width or mixer), naming what differs.
    """
    if isinstance(checkpoint.get("model"), dict) and "state_dict" in checkpoint["model"]:
        checkpoint = checkpoint["model"]  # load_checkpoint_file puts other layouts under "model"
    key = "state_dict_ema" if use_ema else "state_dict"
    if key in checkpoint:
        state = checkpoint[key]
    elif use_ema:
        raise ValueError("the checkpoint has no state_dict_ema (timm writes it with --model-ema)")
    else:
        state = checkpoint.get("model", checkpoint)
    state = {name[len("module."):] if name.startswith("module.") else name: value
             for name, value in state.items() if not name.startswith(("linear.", "module.linear."))}
    prefixes = [name for name, module in model.named_modules() if isinstance(module, LambdaResNet)]
    if len(prefixes) != 1:
        raise ValueError(f"the config's model has {len(prefixes)} LambdaResNet backbones, not 1 "
                         f"(is MODEL.BACKBONE.NAME a lambda_det backbone?)")
    prefix = prefixes[0] + "." if prefixes[0] else ""
    wanted = {name[len(prefix):]: tensor.shape for name, tensor in model.state_dict().items()
              if name.startswith(prefix)}
    missing = sorted(set(wanted) - set(state))
    unexpected = sorted(set(state) - set(wanted))
    mismatched = [f"{name} {tuple(state[name].shape)} vs {tuple(wanted[name])}"
                  for name in sorted(set(wanted) & set(state))
                  if tuple(state[name].shape) != tuple(wanted[name])]
    if missing or unexpected or mismatched:
        raise ValueError(
            f"the classifier is not the config's backbone (MODEL.LAMBDA_RESNET: another depth, "
            f"placement, width or mixer?): {len(missing)} backbone weights missing "
            f"{missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}, {len(mismatched)} of "
            f"another shape (checkpoint vs backbone) {mismatched[:3]}")
    return {prefix + name: value for name, value in state.items()}

