"""C4 heads (detectron2's Res5ROIHeads on a res4-only LambdaResNet): the backbone builds no stage
after its last output, so every parameter trains (DDP requires it), and the heads' res5 takes the
LambdaResNet's res4 channels."""

import json
import logging

import pytest
import torch
from conftest import overrides, run_tool, tiny_detection_batch
from detectron2.modeling import build_model
from detectron2.utils.events import EventStorage

from lambda_det.modeling import LambdaResNet
from lambda_det.run_config import load_config

# detectron2's defaults are its C4 R-CNN (res4 outputs, Res5ROIHeads, RPN on res4); this is its
# Mask R-CNN C4 with a narrow LambdaResNet-26 trained from scratch.
C4_MASK_RCNN = {
    "MODEL.DEVICE": "cpu",
    "MODEL.MASK_ON": True,
    "MODEL.WEIGHTS": "",
    "MODEL.BACKBONE.NAME": "build_lambda_resnet_backbone",
    "MODEL.BACKBONE.FREEZE_AT": 0,
    "MODEL.RESNETS.NORM": "BN",
    "MODEL.RESNETS.RES2_OUT_CHANNELS": 64,
    "MODEL.LAMBDA_RESNET.DEPTH": 26,
    "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER": 0.25,
    "MODEL.LAMBDA_RESNET.SCOPE": 3,
    "MODEL.RESNETS.WIDTH_PER_GROUP": 16,
    "MODEL.ROI_HEADS.NUM_CLASSES": 3,
    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE": 32,
    "MODEL.RPN.PRE_NMS_TOPK_TRAIN": 200,
    "MODEL.RPN.POST_NMS_TOPK_TRAIN": 100,
}


def c4_mask_rcnn(**changes):
    return build_model(load_config(None, overrides({**C4_MASK_RCNN, **changes})))


def test_a_c4_backbone_is_the_full_one_without_res5():
    full = LambdaResNet(26, width_multiplier=0.125, scope=3).state_dict()
    c4 = LambdaResNet(26, width_multiplier=0.125, scope=3, out_features=["res4"])
    assert not hasattr(c4, "res5") and c4.stage_names == ("res2", "res3", "res4")
    assert list(c4.state_dict()) == [name for name in full if not name.startswith("res5.")]
    assert list(c4(torch.randn(1, 3, 32, 32))) == ["res4"]
    # The stem alone builds no stage; a classifier reads res5, so it keeps every stage.
    assert LambdaResNet(26, width_multiplier=0.125, out_features=["stem"]).stage_names == ()
    classifier = LambdaResNet(
        26, width_multiplier=0.125, scope=3, num_classes=5, out_features=["res3", "linear"]
    )
    assert hasattr(classifier, "res5")


def test_every_parameter_of_a_c4_backbone_gets_a_gradient():
    # Lambda blocks only in res5, with the position embedding they share: none of it is built.
    backbone = LambdaResNet(
        26,
        placement="CCCL",
        width_multiplier=0.125,
        scope=3,
        share_position_embeddings=True,
        out_features=["res4"],
    )
    backbone(torch.randn(2, 3, 32, 32))["res4"].sum().backward()
    assert [name for name, parameter in backbone.named_parameters() if parameter.grad is None] == []


def test_every_parameter_of_a_c4_mask_rcnn_gets_a_gradient():
    model = c4_mask_rcnn()
    model.train()
    with EventStorage():
        losses = model(tiny_detection_batch())
    sum(losses.values()).backward()
    assert {"loss_cls", "loss_box_reg", "loss_mask"} <= set(losses)
    assert [
        name
        for name, parameter in model.named_parameters()
        if parameter.requires_grad and parameter.grad is None
    ] == []


def test_c4_heads_that_do_not_fit_the_width_name_the_value_to_set():
    with pytest.raises(
        ValueError,
        match=r"MODEL.RESNETS.RES2_OUT_CHANNELS 256 .* res4 has 256 "
        r".*set MODEL.RESNETS.RES2_OUT_CHANNELS 64$",
    ):
        c4_mask_rcnn(**{"MODEL.RESNETS.RES2_OUT_CHANNELS": 256})
    model = c4_mask_rcnn(
        **{"MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER": 0.5, "MODEL.RESNETS.RES2_OUT_CHANNELS": 128}
    )
    assert model.roi_heads.res5[0].conv1.in_channels == 512


def test_the_build_names_only_resnets_keys_nothing_reads(caplog):
    with caplog.at_level(logging.WARNING, logger="lambda_det.modeling.build"):
        c4_mask_rcnn(**{"MODEL.RESNETS.NUM_GROUPS": 2, "MODEL.RESNETS.WIDTH_PER_GROUP": 8})
    for key in ("NUM_GROUPS", "WIDTH_PER_GROUP", "RES2_OUT_CHANNELS"):  # the heads read them
        assert key not in caplog.text
    caplog.clear()
    # An FPN model has no C4 heads: there, the keys are ignored, and the build says so.
    with caplog.at_level(logging.WARNING, logger="lambda_det.modeling.build"):
        build_model(
            load_config(
                "lambda_r26_shapes",
                overrides(
                    {
                        "MODEL.DEVICE": "cpu",
                        "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER": 0.25,
                        "MODEL.RESNETS.RES2_OUT_CHANNELS": 64,
                    }
                ),
            )
        )
    assert "RES2_OUT_CHANNELS=64" in caplog.text and "ignored" in caplog.text


@pytest.mark.slow
@pytest.mark.e2e
def test_c4_mask_rcnn_trains_in_two_gloo_processes(tmp_path, datasets_root):
    """DDP stops at the second iteration when a parameter got no gradient in the first."""
    settings = {
        **C4_MASK_RCNN,
        "DATASETS.TRAIN": "('lambda_det_shapes_train',)",
        "DATASETS.TEST": "()",
        "INPUT.MIN_SIZE_TRAIN": "(128,)",
        "INPUT.MAX_SIZE_TRAIN": 128,
        "SOLVER.IMS_PER_BATCH": 2,
        "SOLVER.BASE_LR": 0.01,
        "SOLVER.MAX_ITER": 2,  # the second is the one DDP would stop
        "SOLVER.STEPS": "(1,)",
        "SOLVER.WARMUP_ITERS": 1,
        "SOLVER.LOG_PERIOD": 1,
        "DATALOADER.NUM_WORKERS": 0,
        "OUTPUT_DIR": tmp_path / "c4",
    }
    # --dist-url auto: a free port, so that a test running beside it (pytest-xdist) cannot collide.
    argv = ["--num-gpus", "2", "--dist-url", "auto", *overrides(settings)]
    result = run_tool("train_net.py", *argv, datasets_root=datasets_root, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [
        json.loads(line) for line in (tmp_path / "c4" / "metrics.json").read_text().splitlines()
    ]
    assert [line["iteration"] for line in metrics if "total_loss" in line] == [0, 1]
    assert (tmp_path / "c4" / "model_final.pth").is_file()
