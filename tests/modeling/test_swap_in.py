"""A stock detectron2 config with only MODEL.BACKBONE.NAME changed builds the LambdaResNet the
stock config describes (depth, norm, outputs), and refuses stock ImageNet ResNet weights."""
import logging
import subprocess
import sys

import pytest
import torch

from conftest import REPO_ROOT, subprocess_env
from detectron2.layers import FrozenBatchNorm2d
from detectron2.modeling import build_model
from lambda_det.config import load_config
from lambda_det.modeling import LambdaResNet
from lambda_det.engine.preflight import check_training_recipe
from lambda_det.engine.run_settings import yaml_training_settings

# Minimal equivalents of detectron2's model-zoo files (the installed detectron2 ships none), laid
# out as detectron2 lays them out: a Base file and one file per model with _BASE_.
STOCK_BASE = """
MODEL:
  META_ARCHITECTURE: "GeneralizedRCNN"
  BACKBONE:
    NAME: "build_resnet_fpn_backbone"
  RESNETS:
    OUT_FEATURES: ["res2", "res3", "res4", "res5"]
  FPN:
    IN_FEATURES: ["res2", "res3", "res4", "res5"]
  ANCHOR_GENERATOR:
    SIZES: [[32], [64], [128], [256], [512]]
  RPN:
    IN_FEATURES: ["p2", "p3", "p4", "p5", "p6"]
  ROI_HEADS:
    NAME: "StandardROIHeads"
    IN_FEATURES: ["p2", "p3", "p4", "p5"]
  ROI_BOX_HEAD:
    NAME: "FastRCNNConvFCHead"
    NUM_FC: 2
  ROI_MASK_HEAD:
    NAME: "MaskRCNNConvUpsampleHead"
    NUM_CONV: 4
"""
RETINANET_BASE = """
MODEL:
  META_ARCHITECTURE: "RetinaNet"
  BACKBONE:
    NAME: "build_retinanet_resnet_fpn_backbone"
  RESNETS:
    OUT_FEATURES: ["res3", "res4", "res5"]
  ANCHOR_GENERATOR:
    SIZES: [[32, 40, 50], [64, 80, 101], [128, 161, 203], [256, 322, 406], [512, 645, 812]]
  FPN:
    IN_FEATURES: ["res3", "res4", "res5"]
"""
STOCK = {  # the model file on top of its Base
    "mask_rcnn": ("Base-RCNN-FPN", "  MASK_ON: True\n"),
    "cascade_mask_rcnn": ("Base-RCNN-FPN", "  MASK_ON: True\n  ROI_HEADS:\n    NAME: "
                          "CascadeROIHeads\n  ROI_BOX_HEAD:\n    CLS_AGNOSTIC_BBOX_REG: True\n"),
    "panoptic_fpn": ("Base-RCNN-FPN", "  META_ARCHITECTURE: PanopticFPN\n  MASK_ON: True\n"),
    "retinanet": ("Base-RetinaNet", ""),
}
SWAP = {"build_resnet_fpn_backbone": "build_lambda_resnet_fpn_backbone",
        "build_retinanet_resnet_fpn_backbone": "build_retinanet_lambda_resnet_fpn_backbone"}


def stock_config(tmp_path, kind: str, depth: int):
    (tmp_path / "Base-RCNN-FPN.yaml").write_text(STOCK_BASE)
    (tmp_path / "Base-RetinaNet.yaml").write_text(RETINANET_BASE)
    base, model = STOCK[kind]
    path = tmp_path / f"{kind}_R_{depth}_FPN_3x.yaml"
    path.write_text(f"_BASE_: \"{base}.yaml\"\nMODEL:\n"
                    f"  WEIGHTS: \"detectron2://ImageNetPretrained/MSRA/R-{depth}.pkl\"\n"
                    f"  RESNETS:\n    DEPTH: {depth}\n" + model)
    return path


def swapped(path, *overrides):
    """The stock config with only MODEL.BACKBONE.NAME changed (as the README says)."""
    cfg = load_config(str(path), ["MODEL.DEVICE", "meta", *overrides], freeze=False)
    cfg.MODEL.BACKBONE.NAME = SWAP[cfg.MODEL.BACKBONE.NAME]
    return cfg


@pytest.mark.parametrize("kind", list(STOCK))
@pytest.mark.parametrize("depth", [50, 101])
def test_a_stock_config_keeps_its_depth_norm_and_outputs(tmp_path, kind, depth):
    cfg = swapped(stock_config(tmp_path, kind, depth))
    with torch.device("meta"):
        model = build_model(cfg)
    backbone = model.backbone.bottom_up
    assert isinstance(backbone, LambdaResNet) and backbone.depth == depth
    norms = [m for m in backbone.modules() if isinstance(m, (FrozenBatchNorm2d, torch.nn.BatchNorm2d))]
    assert norms and all(isinstance(m, FrozenBatchNorm2d) for m in norms)  # RESNETS.NORM
    expected = ["res3", "res4", "res5"] if kind == "retinanet" else ["res2", "res3", "res4", "res5"]
    assert list(backbone.output_shape()) == expected
    # Training it as it stands is refused in one line that says what to do.
    with pytest.raises(ValueError, match=r"MODEL.WEIGHTS 'detectron2://ImageNetPretrained/MSRA/"
                                         rf"R-{depth}.pkl' is a detectron2 ImageNet ResNet.*"
                                         r"MODEL.WEIGHTS \"\""):
        check_training_recipe(yaml_training_settings(cfg))
    cfg.MODEL.WEIGHTS = ""
    with pytest.raises(ValueError, match="MODEL.RESNETS.NORM 'FrozenBN' freezes randomly"):
        check_training_recipe(yaml_training_settings(cfg))
    cfg.MODEL.LAMBDA_RESNET.NORM = "SyncBN"
    with pytest.raises(ValueError, match="MODEL.BACKBONE.FREEZE_AT 2 freezes randomly"):
        check_training_recipe(yaml_training_settings(cfg))
    cfg.MODEL.BACKBONE.FREEZE_AT = 0
    check_training_recipe(yaml_training_settings(cfg))


def test_lambda_resnet_keys_win_over_resnets(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="lambda_det")
    cfg = swapped(stock_config(tmp_path, "mask_rcnn", 101), "MODEL.LAMBDA_RESNET.DEPTH", "152",
                  "MODEL.LAMBDA_RESNET.NORM", "GN", "MODEL.RESNETS.NUM_GROUPS", "32")
    with torch.device("meta"):
        model = build_model(cfg)
    assert model.backbone.bottom_up.depth == 152
    assert any(isinstance(m, torch.nn.GroupNorm) for m in model.backbone.bottom_up.modules())
    assert "has no use for MODEL.RESNETS NUM_GROUPS=32" in caplog.text
    assert "follows MODEL.RESNETS for OUT_FEATURES ['res2', 'res3', 'res4', 'res5']" in caplog.text


@pytest.mark.slow
@pytest.mark.e2e
def test_train_net_refuses_stock_weights_in_one_line(tmp_path, datasets_root):
    config = stock_config(tmp_path, "mask_rcnn", 50)
    env = subprocess_env()  # the stock config trains on the shapes dataset: the shared copy
    env["DETECTRON2_DATASETS"] = str(datasets_root)  # (by default it would go to ./datasets)
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools/train_net.py"), "--config-file", str(config),
         "MODEL.BACKBONE.NAME", "build_lambda_resnet_fpn_backbone", "MODEL.DEVICE", "cpu",
         "OUTPUT_DIR", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=600)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "error: MODEL.WEIGHTS 'detectron2://ImageNetPretrained/MSRA/R-50.pkl'" in result.stderr
    assert not (tmp_path / "run").exists()
