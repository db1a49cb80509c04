"""A bad LambdaResNet setting in the config is named when the model is built.
(From tests/test_reliability.py.)"""

import pytest
from conftest import tiny_cfg
from detectron2.modeling import build_model


@pytest.mark.parametrize(
    "override,message",
    [
        (("MODEL.LAMBDA_RESNET.DEPTH", 77), "depth must be one of .* got 77"),
        (("MODEL.LAMBDA_RESNET.PLACEMENT", "LLXL"), "got 'LLXL'"),
        (("MODEL.LAMBDA_RESNET.SCOPE", 4), "scope must be an odd integer >= 1.*got 4"),
        (("MODEL.LAMBDA_RESNET.HEADS", 3), "not divisible by heads=3"),
        (("MODEL.LAMBDA_RESNET.HEADS", 0), "heads must be an integer >= 1, got 0"),
        (("MODEL.LAMBDA_RESNET.NORM", "BNN"), "norm must be a detectron2 norm .* got 'BNN'"),
        (
            ("MODEL.LAMBDA_RESNET.OUT_FEATURES", ["res3", "res4", "res5"]),
            r"MODEL.FPN.IN_FEATURES \['res2', 'res3', 'res4', 'res5'\] needs \['res2'\], which "
            r"MODEL.LAMBDA_RESNET.OUT_FEATURES \['res3', 'res4', 'res5'\] does not output",
        ),
    ],
)
def test_bad_configs_are_named(tmp_path, override, message):
    cfg = tiny_cfg(tmp_path, **{override[0]: override[1]})
    with pytest.raises(ValueError, match=message):
        build_model(cfg)
