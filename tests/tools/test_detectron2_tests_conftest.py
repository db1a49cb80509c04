"""tools/detectron2_tests_conftest.py: with it, detectron2's ResNet builders (registry names and
imported functions) build a LambdaResNet from a stock config, yacs or OmegaConf."""

import subprocess
import sys

import pytest
from conftest import REPO_ROOT, subprocess_env

CHECK = """
import runpy
from omegaconf import OmegaConf
from detectron2.config import get_cfg
from detectron2.layers import ShapeSpec
from detectron2.modeling import build_backbone
from detectron2.modeling.backbone import build_resnet_backbone

def bottom_up(name, cfg=None):
    cfg = cfg or get_cfg()
    cfg.MODEL.BACKBONE.NAME = name
    cfg.MODEL.RESNETS.DEPTH = 26
    cfg.MODEL.RESNETS.OUT_FEATURES = cfg.MODEL.FPN.IN_FEATURES = ["res2", "res3", "res4", "res5"]
    built = build_backbone(cfg)
    return type(getattr(built, "bottom_up", built)).__name__

print(type(build_resnet_backbone(get_cfg(), ShapeSpec(channels=3))).__name__)  # before
runpy.run_path({conftest!r})
from detectron2.modeling.backbone import build_resnet_backbone
print(type(build_resnet_backbone(get_cfg(), ShapeSpec(channels=3))).__name__)
for name in ("build_resnet_backbone", "build_resnet_fpn_backbone",
             "build_retinanet_resnet_fpn_backbone"):
    print(bottom_up(name))
cfg = get_cfg()
cfg.MODEL.RESNETS.DEPTH = 26
print(type(build_backbone(OmegaConf.create(cfg.dump()))).__name__)
"""


@pytest.mark.slow
def test_the_conftest_swaps_each_resnet_builder_for_a_lambda_resnet():
    conftest = str(REPO_ROOT / "tools" / "detectron2_tests_conftest.py")
    result = subprocess.run(
        [sys.executable, "-c", CHECK.format(conftest=conftest)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    # detectron2's ResNet before, a LambdaResNet (its detectron2 Backbone) from each builder after
    before, *after = result.stdout.split()
    assert before == "ResNet" and after == ["LambdaResNetBackbone"] * 5
