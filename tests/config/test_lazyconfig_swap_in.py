"""docs/lazyconfig.md's recipe for a LambdaResNet in a stock Detectron2 LazyConfig runs as written,
on a stand-in for detectron2's mask_rcnn_R_50_FPN_1x.py."""

import re

import torch
from conftest import REPO_ROOT
from detectron2.config import LazyCall as L
from detectron2.config import LazyConfig
from detectron2.modeling.backbone import BasicStem, ResNet

from lambda_det import model_zoo
from lambda_det.modeling import LambdaResNet

SECTION = "\n## A LambdaResNet in a stock Detectron2 LazyConfig\n"
STOCK_RECIPE = "detectron2/configs/COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.py"


def documented_snippet() -> str:
    text = (REPO_ROOT / "docs/lazyconfig.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def stock_style_recipe():
    """A Mask R-CNN LazyConfig whose backbone is built as detectron2's mask_rcnn_fpn.py builds
    it: a ResNet-50 bottom_up with frozen BN, the FPN's in_features read from its out_features,
    ImageNet weights and the GPU."""
    cfg = model_zoo.get_config("lambda_r26_shapes.py")
    cfg.model.backbone.bottom_up = L(ResNet)(
        stem=L(BasicStem)(in_channels=3, out_channels=64, norm="FrozenBN"),
        stages=L(ResNet.make_default_stages)(depth=50, stride_in_1x1=True, norm="FrozenBN"),
        out_features=["res2", "res3", "res4", "res5"],
        freeze_at=2,
    )
    cfg.model.backbone.in_features = "${.bottom_up.out_features}"
    cfg.train.init_checkpoint = "detectron2://ImageNetPretrained/MSRA/R-50.pkl"
    cfg.train.device = "cuda"
    return cfg


def test_the_documented_swap_builds_a_lambda_resnet_detector_on_the_cpu(monkeypatch):
    loaded, stand_in = [], stock_style_recipe()

    def load_stand_in(path, *args, **kwargs):
        loaded.append(path)
        return stand_in

    monkeypatch.setattr(LazyConfig, "load", staticmethod(load_stand_in))
    names = {}
    exec(documented_snippet(), names)  # the documentation's own lines, as a user runs them
    assert loaded == [STOCK_RECIPE]
    cfg, model = names["cfg"], names["model"]
    assert cfg.train.init_checkpoint == "" and cfg.train.device == "cpu"
    bottom_up = model.backbone.bottom_up
    assert isinstance(bottom_up, LambdaResNet)  # not the stand-in's ResNet
    assert list(model.backbone.in_features) == ["res2", "res3", "res4", "res5"]
    model.eval()
    with torch.no_grad():
        outputs = model([{"image": torch.zeros(3, 64, 64, dtype=torch.uint8)}])
    assert "instances" in outputs[0]
