"""Stochastic depth in the bottlenecks: the linear rule over blocks, per-image drops with the
1 / (1 - p) scale in training, the identity in evaluation, and nothing at all at rate 0."""

import pytest
import torch
from torchvision.ops import StochasticDepth

from lambda_det.modeling import lambda_resnet
from lambda_det.modeling.blocks import Bottleneck
from lambda_det.modeling.lambda_resnet import STAGES
from lambda_det.modeling.mixers import build_mixer_factory
from lambda_det.run_config import load_config

SMALL = {"width_multiplier": 0.25, "scope": 3}


def blocks(model):
    return [block for name in STAGES for block in getattr(model, name)]


def test_rates_grow_linearly_with_the_block_number():
    model = lambda_resnet(26, drop_path_rate=0.2, **SMALL)  # 2 + 2 + 2 + 2 blocks
    rates = [block.drop_path.p for block in blocks(model)]
    assert rates == pytest.approx([0.2 * i / 8 for i in range(1, 9)])
    assert rates[-1] == pytest.approx(0.2)


def test_rate_zero_adds_nothing_and_evaluation_ignores_the_rate():
    torch.manual_seed(0)
    plain = lambda_resnet(26, **SMALL)
    torch.manual_seed(0)
    dropping = lambda_resnet(26, drop_path_rate=0.3, **SMALL)
    assert not any(isinstance(m, StochasticDepth) for m in plain.modules())
    assert all(block.drop_path is None for block in blocks(plain))
    # Same construction (no parameter, no random draw), so the same weights ...
    for (name, a), b in zip(plain.state_dict().items(), dropping.state_dict().values()):
        assert torch.equal(a, b), name
    # ... and in evaluation the same outputs.
    images = torch.randn(2, 3, 64, 64)
    expected = plain.eval()(images)
    for name, value in dropping.eval()(images).items():
        assert torch.equal(value, expected[name]), name


def test_training_drops_or_scales_each_images_residual_branch():
    torch.manual_seed(0)
    # No norm: each image's output depends on that image only.
    block = Bottleneck(16, 16, width=4, mixer=build_mixer_factory("conv"), norm="", drop_path=0.5)
    block.init_weights()
    x = torch.randn(32, 16, 6, 6)
    branch_block = Bottleneck(16, 16, width=4, mixer=build_mixer_factory("conv"), norm="")
    branch_block.load_state_dict(block.state_dict())
    with torch.no_grad():
        full = branch_block(x)  # relu(branch + x)
        branch = branch_block.conv3(
            torch.relu(branch_block.mixer(torch.relu(branch_block.conv1(x))))
        )
        assert torch.allclose(full, torch.relu(branch + x))
        assert torch.equal(block.eval()(x), full)  # evaluation: the identity
        out = block.train()(x)
    dropped = torch.relu(x)
    kept = torch.relu(2 * branch + x)  # scaled by 1 / (1 - 0.5)
    is_dropped = [torch.allclose(out[i], dropped[i]) for i in range(len(x))]
    is_kept = [torch.allclose(out[i], kept[i], atol=1e-6) for i in range(len(x))]
    assert all(d != k for d, k in zip(is_dropped, is_kept))
    assert 4 <= sum(is_dropped) <= 28  # per image, not per batch


def test_the_config_key_and_timm_reach_the_blocks():
    cfg = load_config(
        "lambda_r26_shapes", ["MODEL.DEVICE", "cpu", "MODEL.LAMBDA_RESNET.DROP_PATH_RATE", "0.1"]
    )
    from detectron2.modeling import build_backbone

    backbone = build_backbone(cfg).bottom_up
    assert blocks(backbone)[-1].drop_path.p == pytest.approx(0.1)
    timm = pytest.importorskip("timm")
    import lambda_det.modeling.timm_models  # noqa: F401  (registers the models)

    model = timm.create_model("lambda_resnet26_det", num_classes=2, drop_path_rate=0.1, **SMALL)
    assert blocks(model)[0].drop_path.p == pytest.approx(0.1 / 8)
    assert all(
        block.drop_path is None
        for block in blocks(timm.create_model("lambda_resnet26_det", **SMALL))
    )


@pytest.mark.parametrize("rate", [-0.1, 1.0])
def test_a_rate_outside_zero_to_one_is_refused(rate):
    with pytest.raises(ValueError, match=rf"drop_path_rate must be in \[0, 1\), got {rate}"):
        lambda_resnet(26, drop_path_rate=rate, **SMALL)
