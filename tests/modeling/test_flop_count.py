"""Detectron2's FlopCountAnalysis (what tools/analyze_model.py --tasks flop runs) counts every op
and module of a LambdaResNet: lambda_det.modeling registers its layers' handles with fvcore."""

import logging

import pytest
import torch
from detectron2.utils.analysis import FlopCountAnalysis

from lambda_det.modeling import eager_impls, lambda_resnet


@pytest.mark.parametrize(
    "options", [dict(scope=3), dict(scope=None, max_size=16), dict(mixer="aft_conv")]
)
def test_detectron2_counts_every_op_and_module(one_torch_thread, caplog, options):
    torch.manual_seed(0)
    model = lambda_resnet(26, width_multiplier=0.25, **options).eval()
    analysis = FlopCountAnalysis(model, torch.randn(1, 3, 64, 64))
    with caplog.at_level(logging.WARNING, logger="fvcore.nn.jit_analysis"):
        total = analysis.total()
    assert caplog.text == ""  # no "Unsupported operator", no "never called"
    assert analysis.by_operator("model.res3.0.shortcut.0") == {"avg_pool2d": 64 * 8 * 8 * 4}
    mixer = analysis.by_operator("model.res5.0.mixer")
    expected = {"conv", "avg_pool2d"} | (
        set() if "mixer" in options else {"batch_norm", "einsum", "baddbmm_"}
    )
    assert expected <= set(mixer) and sum(mixer.values()) < total


@pytest.mark.slow
def test_eager_impls_counts_the_forms_eager_runs(one_torch_thread):
    """A trace runs "auto" as "conv"; eager_impls counts what eager mode runs at this size."""
    torch.manual_seed(0)
    model = lambda_resnet(26, width_multiplier=0.25, scope=3).eval()
    x = torch.randn(1, 3, 128, 128)  # c4 8 x 8: auto -> tiled
    traced = FlopCountAnalysis(model, x).by_operator("model.res4.1.mixer")
    with eager_impls(model, x):
        eager = FlopCountAnalysis(model, x).by_operator("model.res4.1.mixer")
    assert "bmm" in eager and "bmm" not in traced and traced["conv"] > eager["conv"]
    assert model.res4[1].mixer.impl == "auto"
