"""A LambdaResNet classifier trained with timm (:mod:`lambda_det.modeling.timm_models`) as a
detector's backbone weights (tools/convert_timm_checkpoint.py). Needs neither timm nor
detectron2: the checkpoint is a state dict, matched by names and shapes."""

from typing import Dict

import torch
from torch import nn

from lambda_det.modeling.lambda_resnet import LambdaResNet
from lambda_det.utils.errors import UserError

__all__ = ["convert_classifier_checkpoint"]


def convert_classifier_checkpoint(
    checkpoint: Dict, model: nn.Module, use_ema: bool = False
) -> Dict[str, torch.Tensor]:
    """The backbone weights of a timm classifier checkpoint, named as in ``model`` (a detector
    built from the config to fine-tune, e.g. on the meta device: only names and shapes are used).

    Args:
        checkpoint: as :func:`lambda_det.checkpoint.load_checkpoint_file` reads a timm file:
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
        raise UserError("the checkpoint has no state_dict_ema (timm writes it with --model-ema)")
    else:
        state = checkpoint.get("model", checkpoint)
    state = {
        name[len("module.") :] if name.startswith("module.") else name: value
        for name, value in state.items()
        if not name.startswith(("linear.", "module.linear."))
    }
    prefixes = [name for name, module in model.named_modules() if isinstance(module, LambdaResNet)]
    if len(prefixes) != 1:
        raise UserError(
            f"the config's model has {len(prefixes)} LambdaResNet backbones, not 1 "
            f"(is MODEL.BACKBONE.NAME a lambda_det backbone?)"
        )
    prefix = prefixes[0] + "." if prefixes[0] else ""
    wanted = {
        name[len(prefix) :]: tensor.shape
        for name, tensor in model.state_dict().items()
        if name.startswith(prefix)
    }
    missing = sorted(set(wanted) - set(state))
    unexpected = sorted(set(state) - set(wanted))
    mismatched = [
        f"{name} {tuple(state[name].shape)} vs {tuple(wanted[name])}"
        for name in sorted(set(wanted) & set(state))
        if tuple(state[name].shape) != tuple(wanted[name])
    ]
    if missing or unexpected or mismatched:
        raise UserError(
            f"the classifier is not the config's backbone (MODEL.LAMBDA_RESNET: another depth, "
            f"placement, width or mixer?): {len(missing)} backbone weights missing "
            f"{missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}, {len(mismatched)} of "
            f"another shape (checkpoint vs backbone) {mismatched[:3]}"
        )
    return {prefix + name: value for name, value in state.items()}
