"""The models' numbers stay put: state dict keys and shapes, initial weights and outputs under a
fixed seed, recorded from lambda_det as released. A refactoring that reorders construction (and
so the random init), renames a parameter or changes the math fails here."""

import hashlib

import pytest
import torch
from detectron2.layers import ShapeSpec
from detectron2.modeling import build_backbone

from lambda_det.modeling import lambda_resnet
from lambda_det.run_config import load_config

TINY = dict(width_multiplier=0.25)
BUILDERS = {
    "lambda": lambda: lambda_resnet(26, scope=3, **TINY),
    "lambda_global_shared": lambda: lambda_resnet(
        26, placement="CCLL", scope=None, max_size=8, share_position_embeddings=True, **TINY
    ),
    "aft_conv": lambda: lambda_resnet(26, mixer="aft_conv", **TINY),
    "demo_lambda": lambda: build_backbone(load_config("lambda_r26_shapes"), ShapeSpec(channels=3)),
    "demo_aft_conv": lambda: build_backbone(
        load_config("aft_conv_r26_shapes"), ShapeSpec(channels=3)
    ),
}
# (digest of the state dict's keys and shapes, position-weighted sum of |weights|, sums of the
# outputs of one 64 x 64 image).
RECORDED = {
    "lambda": (
        "90d604255e3727cf",
        7251273.2860632045,
        {
            "res2": 1812.6787606177531,
            "res3": 456.9707067986528,
            "res4": 172.24708713484142,
            "res5": 69.39321170109179,
        },
    ),
    "lambda_global_shared": (
        "db79e5ed462557a8",
        9563454.912831776,
        {
            "res2": 2032.6966619288355,
            "res3": 674.3741636410778,
            "res4": 247.39462749193626,
            "res5": 94.66173898995112,
        },
    ),
    "aft_conv": (
        "658b78ae76c09347",
        8333835.263593594,
        {
            "res2": 1776.967631218895,
            "res3": 771.5016000089618,
            "res4": 255.4019890741838,
            "res5": 93.08947607084701,
        },
    ),
    "demo_lambda": (
        "f37be0174948c288",
        25785203.543766376,
        {
            "p2": -264.2017369791138,
            "p3": 13.34431580726232,
            "p4": -5.605870752944611,
            "p5": 0.5869393684843089,
            "p6": 0.19014152357704006,
        },
    ),
    "demo_aft_conv": (
        "550bd70cb31e2d32",
        29611878.769958436,
        {
            "p2": 144.25975772420134,
            "p3": 16.65073397830747,
            "p4": 4.27300692191784,
            "p5": 0.34113035322479845,
            "p6": -0.017177615081891418,
        },
    ),
}


def fingerprint(build):
    torch.manual_seed(0)
    model = build().eval()
    state = model.state_dict()
    layout = "\n".join(f"{key}{tuple(value.shape)}" for key, value in state.items())
    keys = hashlib.sha256(layout.encode()).hexdigest()[:16]
    # Weighted by position, so two tensors that swap their random draws change it too.
    weights = sum(
        float(value.double().abs().sum()) * (index + 1)
        for index, value in enumerate(state.values())
    )
    torch.manual_seed(1)
    with torch.no_grad():
        outputs = model(torch.randn(1, 3, 64, 64))
    return keys, weights, {name: float(output.double().sum()) for name, output in outputs.items()}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_state_dict_keys_init_and_outputs_are_the_recorded_ones(one_torch_thread, name):
    keys, weights, outputs = fingerprint(BUILDERS[name])
    recorded_keys, recorded_weights, recorded_outputs = RECORDED[name]
    assert keys == recorded_keys
    assert weights == pytest.approx(recorded_weights, rel=1e-9)
    assert outputs == pytest.approx(recorded_outputs, rel=1e-6, abs=1e-6)
