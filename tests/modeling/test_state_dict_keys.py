"""The state dict keys of the detectron2 backbones and of the timm models, in order, are the ones
recorded from lambda_det as released (recorded_state_dict_keys.json): their checkpoints load. The
detectron2 backbone is an adapter over the torch-only LambdaResNet that adds no module."""

import json
from pathlib import Path

import pytest
import torch
from detectron2.layers import FrozenBatchNorm2d, ShapeSpec
from detectron2.modeling import build_backbone

from lambda_det.run_config import load_config

timm = pytest.importorskip("timm")
import lambda_det.modeling.timm_models  # noqa: F401  (registers the models)

RECORDED = json.loads(Path(__file__).with_name("recorded_state_dict_keys.json").read_text())
SMALL = dict(width_multiplier=0.25, scope=3)


def detector_backbone(config: str, *overrides: str) -> torch.nn.Module:
    return build_backbone(load_config(config, list(overrides)), ShapeSpec(channels=3))


BUILDERS = {
    "lambda_r26_shapes": lambda: detector_backbone("lambda_r26_shapes"),
    "aft_conv_r26_shapes": lambda: detector_backbone("aft_conv_r26_shapes"),
    "lambda_r26_shapes FREEZE_AT 2": lambda: detector_backbone(
        "lambda_r26_shapes", "MODEL.BACKBONE.FREEZE_AT", "2"
    ),
    "lambda_resnet26_det": lambda: timm.create_model("lambda_resnet26_det", **SMALL),
    "lambda_resnet26_c4_det": lambda: timm.create_model("lambda_resnet26_c4_det", **SMALL),
    "resnetrs26_se_det": lambda: timm.create_model("resnetrs26_se_det", width_multiplier=0.25),
    "lambda_resnet26_det freeze_at=2": lambda: timm.create_model(
        "lambda_resnet26_det", freeze_at=2, **SMALL
    ),
}


def test_every_recorded_model_is_built():
    assert sorted(BUILDERS) == sorted(RECORDED)


def weight_keys(model: torch.nn.Module) -> list:
    """The state dict's keys but a frozen norm's ``num_batches_tracked``: detectron2 after 0.6
    (checked with main 02b5c4e) keeps it when it freezes a BatchNorm, 0.6 drops it; no weight."""
    frozen = {
        f"{name}.num_batches_tracked"
        for name, module in model.named_modules()
        if isinstance(module, FrozenBatchNorm2d)
    }
    return [key for key in model.state_dict() if key not in frozen]


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_state_dict_keys_are_the_recorded_ones(name):
    with torch.device("meta"):  # names only
        model = BUILDERS[name]()
    assert weight_keys(model) == RECORDED[name]
