"""A stock detectron2 config with only MODEL.BACKBONE.NAME changed builds the LambdaResNet the
stock config describes (depth, norm, outputs), and refuses stock ImageNet ResNet weights."""

import logging
import re

import pytest
import torch
from conftest import exit_status
from detectron2 import model_zoo
from detectron2.layers import FrozenBatchNorm2d
from detectron2.modeling import build_model

from lambda_det.cli import train_net
from lambda_det.engine.preflight import check_training_recipe
from lambda_det.engine.run_settings import yaml_training_settings
from lambda_det.modeling import LambdaResNet
from lambda_det.modeling import build as modeling_build
from lambda_det.run_config import get_cfg, load_config
from lambda_det.utils.errors import UserKeyError

# detectron2's own model-zoo files, as the installed detectron2 ships them (with their _BASE_).
STOCK = {
    "mask_rcnn": "COCO-InstanceSegmentation/mask_rcnn_R_{depth}_FPN_3x.yaml",
    "cascade_mask_rcnn": "Misc/cascade_mask_rcnn_R_50_FPN_3x.yaml",
    "panoptic_fpn": "COCO-PanopticSegmentation/panoptic_fpn_R_{depth}_3x.yaml",
    "retinanet": "COCO-Detection/retinanet_R_{depth}_FPN_3x.yaml",
}
SWAP = {
    "build_resnet_fpn_backbone": "build_lambda_resnet_fpn_backbone",
    "build_retinanet_resnet_fpn_backbone": "build_retinanet_lambda_resnet_fpn_backbone",
}


def stock_config(kind: str, depth: int) -> str:
    """The model zoo's config of ``kind`` at ``depth`` (cascade: detectron2 ships its R-50 only,
    so depth 101 is set the way a user would, with MODEL.RESNETS.DEPTH)."""
    return model_zoo.get_config_file(STOCK[kind].format(depth=depth))


def swapped(kind: str, depth: int, *overrides):
    """The stock config with only MODEL.BACKBONE.NAME changed (as the README says)."""
    overrides = (
        ["MODEL.RESNETS.DEPTH", str(depth), *overrides]
        if "{depth}" not in STOCK[kind]
        else list(overrides)
    )
    cfg = load_config(stock_config(kind, depth), ["MODEL.DEVICE", "meta", *overrides], freeze=False)
    cfg.MODEL.BACKBONE.NAME = SWAP[cfg.MODEL.BACKBONE.NAME]
    return cfg


@pytest.mark.parametrize("kind", list(STOCK))
@pytest.mark.parametrize("depth", [50, 101])
def test_a_stock_config_keeps_its_depth_norm_and_outputs(kind, depth):
    cfg = swapped(kind, depth)
    with torch.device("meta"):
        model = build_model(cfg)
    backbone = model.backbone.bottom_up
    assert isinstance(backbone, LambdaResNet) and backbone.depth == depth
    norms = [
        m for m in backbone.modules() if isinstance(m, (FrozenBatchNorm2d, torch.nn.BatchNorm2d))
    ]
    assert norms and all(isinstance(m, FrozenBatchNorm2d) for m in norms)  # RESNETS.NORM
    expected = ["res3", "res4", "res5"] if kind == "retinanet" else ["res2", "res3", "res4", "res5"]
    assert list(backbone.output_shape()) == expected
    # Training it as it stands is refused in one line that says what to do.
    assert cfg.MODEL.WEIGHTS.startswith("detectron2://ImageNetPretrained/MSRA/R-")
    with pytest.raises(
        ValueError,
        match=rf"MODEL.WEIGHTS '{re.escape(cfg.MODEL.WEIGHTS)}' is a "
        r"detectron2 ImageNet ResNet.*MODEL.WEIGHTS \"\"",
    ):
        check_training_recipe(yaml_training_settings(cfg))
    cfg.MODEL.WEIGHTS = ""
    with pytest.raises(ValueError, match="MODEL.RESNETS.NORM 'FrozenBN' freezes randomly"):
        check_training_recipe(yaml_training_settings(cfg))
    cfg.MODEL.LAMBDA_RESNET.NORM = "SyncBN"
    with pytest.raises(ValueError, match="MODEL.BACKBONE.FREEZE_AT 2 freezes randomly"):
        check_training_recipe(yaml_training_settings(cfg))
    cfg.MODEL.BACKBONE.FREEZE_AT = 0
    check_training_recipe(yaml_training_settings(cfg))


def test_lambda_resnet_keys_win_over_resnets(caplog):
    caplog.set_level(logging.INFO, logger="lambda_det")
    cfg = swapped(
        "mask_rcnn",
        101,
        "MODEL.LAMBDA_RESNET.DEPTH",
        "152",
        "MODEL.LAMBDA_RESNET.NORM",
        "GN",
        "MODEL.RESNETS.NUM_GROUPS",
        "32",
    )
    with torch.device("meta"):
        model = build_model(cfg)
    assert model.backbone.bottom_up.depth == 152
    assert any(isinstance(m, torch.nn.GroupNorm) for m in model.backbone.bottom_up.modules())
    assert "has no use for MODEL.RESNETS NUM_GROUPS=32" in caplog.text
    assert "follows MODEL.RESNETS for OUT_FEATURES ['res2', 'res3', 'res4', 'res5']" in caplog.text


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["mask_rcnn", "retinanet"])
def test_train_net_refuses_stock_weights_in_one_line(tmp_path, shapes, kind, capsys):
    """tools/train_net.py's main() reads the stock file itself (RetinaNet's anchors are its
    arithmetic tag) and stops at the weights, not at the config. The stock config trains on
    the shapes dataset's shared copy (``shapes``: by default it would go to ./datasets)."""
    config = stock_config(kind, 50)
    status, err = exit_status(
        train_net.main,
        [
            "--config-file",
            str(config),
            "MODEL.BACKBONE.NAME",
            SWAP[load_config(config).MODEL.BACKBONE.NAME],
            "MODEL.DEVICE",
            "cpu",
            "OUTPUT_DIR",
            str(tmp_path / "run"),
        ],
        capsys,
    )
    assert status == 2 and "Traceback" not in err, err[-2000:]
    assert "error: MODEL.WEIGHTS 'detectron2://ImageNetPretrained/MSRA/R-50.pkl'" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "key, registry",
    [("MODEL.META_ARCHITECTURE", "META_ARCH"), ("MODEL.BACKBONE.NAME", "BACKBONE")],
)
def test_a_name_that_detectron2s_registries_lack_is_a_user_error(key, registry):
    """The config names it: a UserKeyError (also the KeyError detectron2 raises), with
    fvcore's message."""
    cfg = get_cfg()
    cfg.merge_from_list([key, "NoSuchName", "MODEL.DEVICE", "cpu"])
    with pytest.raises(UserKeyError) as caught, torch.device("meta"):
        modeling_build.build_detectron2_model(cfg)
    assert isinstance(caught.value, KeyError)
    assert caught.value.args == (f"No object named 'NoSuchName' found in '{registry}' registry!",)


def test_another_key_error_of_a_build_stays_a_bug(monkeypatch):
    """The control: a KeyError that names no registry entry is no UserError."""

    def build_model(cfg):
        raise KeyError("an internal key")

    monkeypatch.setattr(modeling_build, "build_model", build_model)
    with pytest.raises(KeyError, match="an internal key") as caught:
        modeling_build.build_detectron2_model(get_cfg())
    assert not isinstance(caught.value, UserKeyError)
