"""lambda_det's timm models keep timm's model contract (what timm's own tests/test_models.py
checks, on tiny models): pretrained cfgs, heads, features, intermediates, grad checkpointing,
TorchScript, fx feature extraction, and errors for unknown arguments."""

import io

import pytest
import torch

timm = pytest.importorskip("timm")

from lambda_det.modeling import DEPTHS, timm_models
from lambda_det.modeling.timm_models import PRETRAINED_CFG, TIMM_VARIANTS, TimmLambdaResNet

TINY = {"width_multiplier": 0.25, "scope": 3}
NAMES = timm.list_models("*_det", name_matches_cfg=True)


def images():
    return torch.randn(2, 3, 64, 64)


def test_every_model_has_a_pretrained_cfg():
    assert len(NAMES) == 8 * len(TIMM_VARIANTS)  # name_matches_cfg: only names with a cfg
    for name in NAMES:
        cfg = timm.get_pretrained_cfg(name)
        assert cfg.architecture == name and not cfg.has_weights
        assert (cfg.input_size, cfg.mean, cfg.interpolation, cfg.first_conv, cfg.classifier) == (
            PRETRAINED_CFG["input_size"],
            PRETRAINED_CFG["mean"],
            "bicubic",
            "stem.convs.0",
            "linear",
        )
    assert not timm.list_models("*_det", pretrained=True)  # no weights to download


def test_each_name_builds_its_depth_and_variant(monkeypatch):
    """The 32 entrypoints, written out one by one: each is TIMM_VARIANTS' pattern at a depth of
    DEPTHS, builds that depth with that variant's arguments, and a caller's arguments win."""
    built = {}
    monkeypatch.setattr(
        timm_models,
        "build_model_with_cfg",
        lambda cls, name, pretrained, **kwargs: built.setdefault(name, kwargs),
    )
    expected = {
        pattern.format(depth): {"depth": depth, **variant}
        for pattern, variant in TIMM_VARIANTS.items()
        for depth in DEPTHS
    }
    assert sorted(NAMES) == sorted(expected) and len(NAMES) == 32
    for name in NAMES:
        # timm's entrypoint is the module's attribute of that name (`import *` needs it).
        entrypoint = timm.models.model_entrypoint(name)
        assert entrypoint is getattr(timm_models, name) and entrypoint.__name__ == name
        entrypoint()
    assert built == expected
    built.clear()
    timm_models.resnetrs26_det(placement="paper")
    assert built["resnetrs26_det"] == {"depth": 26, "placement": "paper"}


def test_cfg_names_the_first_conv_classifier_and_pool_size():
    model = timm.create_model("resnetrs26_det", width_multiplier=0.25).eval()
    state = model.state_dict()
    cfg = model.pretrained_cfg
    assert f"{cfg['first_conv']}.weight" in state and f"{cfg['classifier']}.weight" in state
    features = model.forward_features(torch.randn(1, *cfg["input_size"]))
    assert features.shape[1:] == (model.num_features, *cfg["pool_size"])


@pytest.mark.parametrize("name", ["lambda_resnet26_det", "resnetrs26_se_det"])
def test_heads_without_classifier_or_pool(name):
    model = timm.create_model(name, **TINY).eval()
    x = images()
    features = model.forward_features(x)
    pooled = model.forward_head(features, pre_logits=True)
    assert pooled.shape == (2, model.num_features) and model.head_hidden_size == model.num_features
    model.reset_classifier(0)
    assert model.num_classes == 0 and torch.equal(model(x), pooled)
    model.reset_classifier(0, "")
    assert torch.equal(model(x), features)
    for pool, expected in (("avg", pooled), ("", features)):
        built = timm.create_model(name, num_classes=0, global_pool=pool, **TINY).eval()
        built.load_state_dict(model.state_dict())  # the same weights, no classifier
        assert torch.equal(built(x), expected)


def test_head_arguments_are_checked():
    with pytest.raises(ValueError, match="global_pool='' .* needs num_classes=0"):
        timm.create_model("resnetrs26_det", global_pool="", **TINY)
    with pytest.raises(ValueError, match=r"global_pool must be a pool timm's .* got 'median'"):
        timm.create_model("resnetrs26_det", global_pool="median", **TINY)
    model = timm.create_model("resnetrs26_det", num_classes=0, **TINY)
    with pytest.raises(ValueError, match="num_classes must be an integer >= 0, got -1"):
        model.reset_classifier(-1)


@pytest.mark.parametrize("pool", ["avg", "max", "avgmax", "catavgmax", "fast", "fastcatavgmax"])
def test_every_global_pool_timm_takes(pool):
    """As timm's ResNet: the classifier takes the pool's features (2 C for "catavgmax")."""
    torch.manual_seed(0)
    model = timm.create_model("resnetrs26_det", global_pool=pool, num_classes=5, **TINY).eval()
    x = images()
    multiple = 2 if pool.endswith("catavgmax") else 1
    assert model.forward_head(model.forward_features(x), pre_logits=True).shape == (
        2,
        multiple * model.num_features,
    )
    assert model(x).shape == (2, 5) and model.get_classifier().in_features == multiple * 512
    model.reset_classifier(3, "catavgmax")
    assert model(x).shape == (2, 3) and model.get_classifier().in_features == 2 * 512
    model.reset_classifier(0, pool)
    assert model(x).shape == (2, multiple * model.num_features)


def test_group_matcher_groups_for_layer_decay():
    """timm's layer-wise learning rate decay groups the stem, then each block in order."""
    from timm.optim import create_optimizer_v2

    model = timm.create_model("lambda_resnet26_det", num_classes=5, **TINY)
    fine = model.group_matcher()
    assert fine == {"stem": r"^stem", "blocks": r"^res(\d+)\.(\d+)"}
    assert model.group_matcher(coarse=True)["blocks"] == r"^res(\d+)"
    groups = timm.models.group_parameters(model, fine)
    # stem, the 8 blocks, then what no pattern matches (the classifier) last
    assert len(groups) == 10 and all(name.startswith("stem") for name in groups[0])
    assert groups[1][0].startswith("res2.0.") and groups[8][0].startswith("res5.1.")
    assert all(name.startswith("linear") for name in groups[9])
    optimizer = create_optimizer_v2(model, "adamw", lr=1e-3, layer_decay=0.5)
    scales = sorted({group["lr_scale"] for group in optimizer.param_groups})
    assert len(scales) == 10 and scales[-1] == 1.0  # one scale per layer, the head's 1


@pytest.mark.parametrize("name", ["lambda_resnet26_det", "resnetrs26_det"])
def test_features_only_and_intermediates(name):
    torch.manual_seed(0)
    model = timm.create_model(name, **TINY).eval()
    x = images()
    final, intermediates = model.forward_intermediates(x)
    assert torch.equal(final, model.forward_features(x))
    info = timm.models.FeatureInfo(model.feature_info, len(model.feature_info))
    assert info.channels() == [16, 64, 128, 256, 512] and info.reduction() == [4, 4, 8, 16, 32]
    assert [tuple(t.shape[1:]) for t in intermediates] == [
        (channels, 64 // reduction, 64 // reduction)
        for channels, reduction in zip(info.channels(), info.reduction())
    ]
    assert model.forward_intermediates(x, indices=[1, -1], intermediates_only=True)[0].equal(
        intermediates[1]
    )
    for feature_cls in ("list", "getter", "fx"):
        torch.manual_seed(0)
        extractor = timm.create_model(
            name, features_only=True, out_indices=(1, 3), feature_cls=feature_cls, **TINY
        ).eval()
        assert extractor.feature_info.channels() == [64, 256]
        outputs = extractor(x)
        assert [out.equal(want) for out, want in zip(outputs, intermediates[1::2])] == [True, True]


def test_pruned_model_keeps_what_the_indices_need():
    model = timm.create_model("lambda_resnet26_det", **TINY).eval()
    assert model.prune_intermediate_layers([0, 2]) == [0, 2]
    assert isinstance(model.res4, torch.nn.Identity) and isinstance(model.res5, torch.nn.Identity)
    assert model.num_classes == 0 and not isinstance(model.res3, torch.nn.Identity)


def test_grad_checkpointing_recomputes_blocks_with_the_same_gradients():
    torch.manual_seed(0)
    model = timm.create_model("lambda_resnet26_det", num_classes=4, **TINY)
    calls = []
    model.res5[1].register_forward_pre_hook(lambda *args: calls.append(1))
    x = images()
    gradients = []
    for checkpointing in (False, True):
        model.set_grad_checkpointing(checkpointing)
        calls.clear()
        loss = model(x).square().sum()
        gradients.append(torch.autograd.grad(loss, list(model.parameters())))
        assert len(calls) == (2 if checkpointing else 1)  # recomputed in backward
    for plain, checkpointed in zip(*gradients):
        assert torch.equal(plain, checkpointed)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lambda_resnet26_det", "lambda_resnet26_c4_det"])
def test_torchscript_saves_and_runs(name):
    with timm.layers.set_layer_config(scriptable=True):
        model = timm.create_model(name, num_classes=3, **TINY).eval()
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(model), buffer)
    buffer.seek(0)
    x = images()
    torch.testing.assert_close(torch.jit.load(buffer)(x), model(x), rtol=1e-5, atol=1e-5)


def test_unknown_arguments_are_named_with_where_they_are_valid():
    with pytest.raises(
        TypeError,
        match=r"\['bn_momentum'\] .* 'bn_momentum' is not an option "
        r"of these models. They take timm's \('num_classes'",
    ):
        timm.create_model("resnetrs26_det", bn_momentum=0.01)
    with pytest.raises(TypeError, match="'features_only' is an option of timm.create_model"):
        TimmLambdaResNet(26, features_only=True)
    with pytest.raises(TypeError, match="'in_channels' is set from timm's arguments"):
        timm.create_model("resnetrs26_det", in_channels=1)
    with pytest.raises(TypeError, match="the 'aft_conv' mixer's options .*'window_size'"):
        timm.create_model("lambda_resnet26_det", mixer="aft_conv", scope=3)
    # The ResNet-RS twins take the lambda options too (they build no lambda layer).
    timm.create_model("resnetrs26_det", scope=5, width_multiplier=0.25)
