"""The mixer registry: built-in mixers, a mixer added by registration, their config keys."""

from dataclasses import dataclass
from typing import ClassVar, Optional

import pytest
import torch
from conftest import CONFIGS
from detectron2.layers import ShapeSpec
from detectron2.modeling import build_backbone
from torch import nn

import lambda_det
from lambda_det import model_zoo
from lambda_det.cli import train_net as cli
from lambda_det.layers import AFTConv, LambdaLayer, constructor_defaults
from lambda_det.modeling import (
    MIXERS,
    build_mixer_factory,
    lambda_resnet,
    register_mixer,
    unregister_mixer,
    use_mixer,
)
from lambda_det.modeling.blocks import Bottleneck
from lambda_det.modeling.config import BUILT_IN_MIXERS, mixer_options_from_node
from lambda_det.modeling.mixers import (
    mixer_config_defaults,
    mixer_option_defaults,
    mixer_options_from_config,
)
from lambda_det.run_config import config_differences, get_cfg


@dataclass(frozen=True)
class PoolMixer:
    """A toy mixer: average pooling (strided as the block asks), then a 1x1 conv."""

    kernel_size: int = 3

    def __call__(self, in_channels: int, out_channels: int, stride: int) -> nn.Module:
        return nn.Sequential(
            nn.AvgPool2d(self.kernel_size, stride, self.kernel_size // 2, count_include_pad=False),
            nn.Conv2d(in_channels, out_channels, 1, bias=False),
        )


@pytest.fixture
def pool_mixer():
    register_mixer("pool")(PoolMixer)
    try:
        yield "pool"
    finally:
        unregister_mixer("pool")
    assert "pool" not in MIXERS


def small_config(**lambda_resnet_keys):
    cfg = lambda_det.get_cfg()
    cfg.merge_from_file(str(CONFIGS / "Base-RCNN-FPN.yaml"))
    cfg.MODEL.BACKBONE.NAME = "build_lambda_resnet_fpn_backbone"
    cfg.MODEL.FPN.OUT_CHANNELS = 32
    node = cfg.MODEL.LAMBDA_RESNET
    node.DEPTH, node.WIDTH_MULTIPLIER, node.SCOPE = 26, 0.25, 3
    for key, value in lambda_resnet_keys.items():
        node[key] = value
    return cfg


def test_a_registered_mixer_builds_into_a_lambda_resnet(pool_mixer):
    model = lambda_resnet(
        26, placement="CCLL", width_multiplier=0.25, mixer=pool_mixer, kernel_size=5
    )
    pools = [block.mixer[0] for stage in (model.res4, model.res5) for block in stage]
    assert len(pools) == 4 and all(pool.kernel_size == 5 for pool in pools)
    assert [pool.stride for pool in pools] == [2, 1, 2, 1]
    assert all(isinstance(block.mixer, nn.Conv2d) for block in model.res3)
    assert "res5.1.mixer.1.weight" in model.state_dict()
    outputs = model(torch.randn(2, 3, 64, 64))
    assert {name: tuple(out.shape) for name, out in outputs.items()} == {
        "res2": (2, 64, 16, 16),
        "res3": (2, 128, 8, 8),
        "res4": (2, 256, 4, 4),
        "res5": (2, 512, 2, 2),
    }
    outputs["res5"].sum().backward()
    assert model.res5[1].mixer[1].weight.grad is not None
    with pytest.raises(
        TypeError,
        match=r"unknown options \['heads'\] for mixer 'pool'; its "
        r"options are \('kernel_size',\)",
    ):
        lambda_resnet(26, mixer=pool_mixer, heads=4)


def test_a_registered_mixer_is_chosen_by_the_mixer_config_key(pool_mixer):
    backbone = build_backbone(small_config(MIXER=pool_mixer), ShapeSpec(channels=3))
    bottom_up = backbone.bottom_up
    placed = [
        block
        for stage in (bottom_up.res4, bottom_up.res5)
        for block in stage
        if isinstance(block.mixer, nn.Sequential)
    ]
    assert len(placed) == 3  # paper placement at depth 26: c4 block 2 and both c5 blocks
    assert all(block.mixer[0].kernel_size == 3 for block in placed)
    outputs = backbone(torch.randn(1, 3, 64, 64))
    assert outputs["p6"].shape == (1, 32, 1, 1)
    cfg = small_config(MIXER=pool_mixer)
    cfg.merge_from_list(["MODEL.LAMBDA_RESNET.POOL.KERNEL_SIZE", "5"])
    placed = build_backbone(cfg, ShapeSpec(channels=3)).bottom_up.res5
    assert [block.mixer[0].kernel_size for block in placed] == [5, 5]


def test_registering_a_mixer_adds_its_options_to_the_config_and_lazy_arguments(pool_mixer):
    assert get_cfg().MODEL.LAMBDA_RESNET.POOL == {"KERNEL_SIZE": 3}  # its options' node
    unregister_mixer(pool_mixer)
    assert "POOL" not in get_cfg().MODEL.LAMBDA_RESNET
    register_mixer(pool_mixer)(PoolMixer)
    assert get_cfg().MODEL.LAMBDA_RESNET.POOL.KERNEL_SIZE == 3
    arguments = {"depth": 26, "mixer": "lambda", **mixer_option_defaults("lambda")}
    use_mixer(arguments, pool_mixer, kernel_size=5)
    assert arguments == {"depth": 26, "mixer": "pool", "kernel_size": 5}
    use_mixer(arguments, "aft_conv")
    assert arguments == {"depth": 26, "mixer": "aft_conv", "heads": 8, "window_size": 7}
    with pytest.raises(TypeError, match=r"unknown options \['dim_k'\] for mixer 'aft_conv'"):
        use_mixer(arguments, "aft_conv", dim_k=8)


@dataclass(frozen=True)
class DilatedMixer:
    """A toy mixer whose keys live in a node of another name, with an option that may be None."""

    CONFIG_NODE: ClassVar[str] = "DILATED_CONV"
    dilation: Optional[int] = None

    def __call__(self, in_channels: int, out_channels: int, stride: int) -> nn.Module:
        return nn.Conv2d(
            in_channels,
            out_channels,
            3,
            stride,
            padding=self.dilation or 1,
            dilation=self.dilation or 1,
            bias=False,
        )


def test_a_mixer_declares_where_its_keys_live_and_a_key_may_hold_none():
    register_mixer("dilated")(DilatedMixer)
    try:
        assert mixer_config_defaults("dilated") == {"DILATION": None}
        node = get_cfg().MODEL.LAMBDA_RESNET
        assert "DILATED" not in node and node.DILATED_CONV == {"DILATION": None}
        assert mixer_options_from_config("dilated", node) == {"dilation": None}
        node.DILATED_CONV.DILATION = 2
        assert mixer_options_from_config("dilated", node) == {"dilation": 2}
    finally:
        unregister_mixer("dilated")


def test_a_mixer_option_needs_a_default_a_config_can_hold():
    @dataclass(frozen=True)
    class NoDefault:
        width: int

    @dataclass(frozen=True)
    class ObjectDefault:
        layer: type = nn.Conv2d

    with pytest.raises(ValueError, match="option 'width' of mixer 'bad' has no default"):
        register_mixer("bad")(NoDefault)
    with pytest.raises(
        ValueError,
        match="option 'layer' of mixer 'bad' defaults to <class "
        ".*Conv2d'>, which a config cannot hold",
    ):
        register_mixer("bad")(ObjectDefault)
    assert "bad" not in MIXERS


@dataclass(frozen=True)
class PlacementMixer:
    """A toy mixer whose option would be a key the backbone has."""

    CONFIG_NODE: ClassVar[str] = ""
    placement: str = "x"

    def __call__(self, in_channels: int, out_channels: int, stride: int) -> nn.Module:
        return nn.Identity()


@pytest.mark.parametrize(
    "name, builder, clash",
    [
        (
            "se",
            PoolMixer,
            "mixer 'se' puts its options under MODEL.LAMBDA_RESNET.SE, which is taken",
        ),
        (
            "placed",
            PlacementMixer,
            "mixer 'placed' option 'placement' would be "
            "MODEL.LAMBDA_RESNET.PLACEMENT, which is taken",
        ),
    ],
)
def test_a_mixer_whose_keys_would_take_a_key_of_the_backbone_is_refused(name, builder, clash):
    register_mixer(name)(builder)
    try:
        with pytest.raises(ValueError, match=clash):
            get_cfg()
    finally:
        unregister_mixer(name)


def test_a_mixer_registered_after_the_config_was_made_is_named(pool_mixer):
    unregister_mixer(pool_mixer)
    cfg = small_config()
    register_mixer(pool_mixer)(PoolMixer)
    cfg.MODEL.LAMBDA_RESNET.MIXER = pool_mixer
    with pytest.raises(
        ValueError,
        match=r"the config has no MODEL.LAMBDA_RESNET.POOL.KERNEL_SIZE "
        r"for mixer 'pool': register the mixer before making "
        r"the config",
    ):
        build_backbone(cfg, ShapeSpec(channels=3))


def test_an_unknown_mixer_is_a_one_line_error_naming_the_registered_ones():
    with pytest.raises(ValueError) as error:
        build_backbone(small_config(MIXER="mlp"), ShapeSpec(channels=3))
    assert str(error.value) == (
        "MODEL.LAMBDA_RESNET.MIXER 'mlp' is not a registered mixer; "
        "they are 'aft_conv', 'conv', 'lambda'"
    )
    with pytest.raises(
        ValueError,
        match="unknown mixer 'mlp'; the registered mixers are 'aft_conv', 'conv', 'lambda'$",
    ):
        build_mixer_factory("mlp")


def test_registry_refuses_a_taken_name_and_an_unknown_one():
    with pytest.raises(ValueError, match="a mixer named 'lambda' is already registered"):
        register_mixer("lambda")(PoolMixer)
    assert MIXERS["lambda"] is not PoolMixer
    with pytest.raises(ValueError, match="unknown mixer 'pool'"):
        unregister_mixer("pool")


def test_mixer_config_and_lazy_defaults_are_the_layers_defaults():
    lambda_defaults, aft_defaults = constructor_defaults(LambdaLayer), constructor_defaults(AFTConv)
    lambda_mixer = build_mixer_factory("lambda")
    for option in ("heads", "dim_k", "dim_u", "scope", "impl", "max_size"):
        assert getattr(lambda_mixer, option) == lambda_defaults[option]
    aft_mixer = build_mixer_factory("aft_conv")
    assert (aft_mixer.heads, aft_mixer.window_size) == (
        aft_defaults["heads"],
        aft_defaults["window_size"],
    )
    node = lambda_det.get_cfg().MODEL.LAMBDA_RESNET
    assert (node.HEADS, node.DIM_K, node.DIM_U, node.SCOPE, node.IMPL, node.MAX_SIZE) == tuple(
        lambda_defaults[key] for key in ("heads", "dim_k", "dim_u", "scope", "impl", "max_size")
    )
    assert node.SHARE_POSITION_EMBEDDINGS is False
    assert node.AFT_CONV == {
        "HEADS": aft_defaults["heads"],
        "WINDOW_SIZE": aft_defaults["window_size"],
    }
    bottom_up = model_zoo.get_config("lambda_r101_mask_rcnn.py").model.backbone.bottom_up
    assert {option: bottom_up[option] for option in mixer_option_defaults("lambda")} == {
        **{
            key: lambda_defaults[key]
            for key in ("heads", "dim_k", "dim_u", "scope", "impl", "max_size")
        },
        "share_position_embeddings": False,
    }


def test_scope_0_in_a_config_is_global_context():
    node = get_cfg().MODEL.LAMBDA_RESNET
    assert mixer_options_from_node(node)["scope"] == 23
    node.SCOPE = 0
    assert mixer_options_from_node(node)["scope"] is None


@pytest.mark.parametrize("mixer", BUILT_IN_MIXERS)
def test_the_config_reads_every_option_of_a_built_in_mixer(mixer):
    node = get_cfg().MODEL.LAMBDA_RESNET
    node.MIXER = mixer
    assert set(mixer_options_from_node(node)) == set(mixer_option_defaults(mixer))


@pytest.mark.parametrize(
    "old, new", [("AFT_HEADS", "AFT_CONV.HEADS"), ("AFT_WINDOW_SIZE", "AFT_CONV.WINDOW_SIZE")]
)
def test_an_old_flat_aft_key_is_one_error_line_naming_its_new_key(tmp_path, capsys, old, new):
    renamed = (
        f"Key MODEL.LAMBDA_RESNET.{old} was renamed to MODEL.LAMBDA_RESNET.{new}; "
        f"please update your config."
    )
    config = tmp_path / "old.yaml"
    config.write_text(
        f"_BASE_: {CONFIGS / 'Demo/lambda_r26_shapes.yaml'}\n"
        f"MODEL:\n  LAMBDA_RESNET:\n    MIXER: aft_conv\n    {old}: 3\n"
    )
    for argv, where in (
        (
            ["--config", "lambda_r26_shapes", f"MODEL.LAMBDA_RESNET.{old}", "3"],
            "in the command-line overrides",
        ),
        (["--config", str(config)], f"in config file {config}"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([*argv, "OUTPUT_DIR", str(tmp_path / "run")])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.splitlines() == [f"error: {where}: {renamed}"]


def test_config_keys_reach_the_mixers():
    cfg = small_config(
        PLACEMENT="CCCL",
        HEADS=2,
        DIM_K=8,
        DIM_U=2,
        SCOPE=0,
        MAX_SIZE=8,
        IMPL="einsum",
        SHARE_POSITION_EMBEDDINGS=True,
        NORM="GN",
    )
    layers = [block.mixer for block in build_backbone(cfg, ShapeSpec(channels=3)).bottom_up.res5]
    assert [
        (layer.heads, layer.dim_k, layer.dim_u, layer.scope, layer.max_size, layer.impl)
        for layer in layers
    ] == [(2, 8, 2, None, 8, "einsum")] * 2
    assert layers[0].position_embedding is layers[1].position_embedding
    assert layers[0].position_embedding.radius == 7  # global context: offsets up to max_size - 1
    assert isinstance(layers[0].query_norm, nn.GroupNorm)  # the backbone's norm
    cfg = small_config(PLACEMENT="CCCL", MIXER="aft_conv")
    cfg.merge_from_list(
        ["MODEL.LAMBDA_RESNET.AFT_CONV.HEADS", "2", "MODEL.LAMBDA_RESNET.AFT_CONV.WINDOW_SIZE", "3"]
    )
    layers = [block.mixer for block in build_backbone(cfg, ShapeSpec(channels=3)).bottom_up.res5]
    assert [(layer.heads, layer.window_size) for layer in layers] == [(2, 3)] * 2


def norm_keys(prefix: str) -> set:
    return {
        f"{prefix}.{name}"
        for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    }


def test_lambda_and_conv_blocks_keep_their_state_dict_keys():
    # Checkpoints load by these names.
    model = lambda_resnet(26, placement="CCCL", width_multiplier=0.25, scope=3)
    lambda_block = {
        key[len("res5.0.") :] for key in model.state_dict() if key.startswith("res5.0.")
    }
    assert lambda_block == {
        "shortcut.1.weight",
        *norm_keys("shortcut.1.norm"),
        "conv1.weight",
        *norm_keys("conv1.norm"),
        "mixer.to_queries.weight",
        "mixer.to_keys.weight",
        "mixer.to_values.weight",
        *norm_keys("mixer.query_norm"),
        *norm_keys("mixer.value_norm"),
        "mixer.position_embedding.weight",
        *norm_keys("mixer_norm"),
        "conv3.weight",
        *norm_keys("conv3.norm"),
    }
    conv_block = {key[len("res4.1.") :] for key in model.state_dict() if key.startswith("res4.1.")}
    assert conv_block == {
        "conv1.weight",
        *norm_keys("conv1.norm"),
        "mixer.weight",
        *norm_keys("mixer_norm"),
        "conv3.weight",
        *norm_keys("conv3.norm"),
    }


def test_a_block_inits_its_last_norm_and_its_mixer_but_not_a_conv_mixer():
    lambda_block = Bottleneck(32, 32, width=8, mixer=build_mixer_factory("lambda", scope=3))
    conv_block = Bottleneck(32, 32, width=8, mixer=build_mixer_factory("conv"))
    for block in (lambda_block, conv_block):
        with torch.no_grad():
            for parameter in block.parameters():
                parameter.fill_(0.5)
        block.init_weights()
        assert torch.count_nonzero(block.conv3.norm.weight) == 0
    assert torch.all(conv_block.mixer.weight == 0.5)  # a conv mixer keeps the backbone's init
    queries = lambda_block.mixer.to_queries.weight
    assert queries.std().item() == pytest.approx((16 * 8) ** -0.5, rel=0.2)  # paper F.2
    assert torch.all(lambda_block.conv1.weight == 0.5)  # convs are the backbone's to init


def test_a_saved_config_with_an_old_flat_aft_key_compares_as_its_new_key():
    saved = "MODEL:\n  LAMBDA_RESNET:\n    MIXER: aft_conv\n    AFT_HEADS: 4\n"
    wanted = get_cfg()
    wanted.merge_from_list(
        ["MODEL.LAMBDA_RESNET.MIXER", "aft_conv", "MODEL.LAMBDA_RESNET.AFT_CONV.HEADS", "4"]
    )
    assert config_differences(saved, wanted.dump()) == []
    wanted.MODEL.LAMBDA_RESNET.AFT_CONV.HEADS = 8
    assert config_differences(saved, wanted.dump()) == [
        "MODEL.LAMBDA_RESNET.AFT_CONV.HEADS: 4 -> 8"
    ]
