"""LambdaResNet backbones: the paper's architecture, the detectron2 backbone over it, errors."""

import pytest
import torch
import torchvision
from conftest import CONFIGS, tiny_detection_batch
from detectron2.config import get_cfg as get_detectron2_cfg
from detectron2.layers import FrozenBatchNorm2d, ShapeSpec
from detectron2.modeling import BACKBONE_REGISTRY, build_model
from detectron2.utils.events import EventStorage

import lambda_det
from lambda_det.layers import LambdaLayer
from lambda_det.modeling import (
    BLOCKS_PER_STAGE,
    PAPER_PARAMETERS,
    LambdaResNet,
    LambdaResNetBackbone,
    lambda_resnet,
    resolve_placement,
)
from lambda_det.modeling.blocks import ResNetRSStem


def parameters_in_millions(model: torch.nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


TABLE_12 = sorted(key for key in PAPER_PARAMETERS if key[0] == 50)
TABLE_13 = sorted(key for key in PAPER_PARAMETERS if key[0] != 50)


@pytest.mark.parametrize("depth,placement,se", TABLE_12)
def test_parameter_counts_match_table_12(depth, placement, se):
    with torch.device("meta"):  # shapes only: the counts without drawing the weights
        model = lambda_resnet(depth, placement=placement, num_classes=1000)
    assert parameters_in_millions(model) == pytest.approx(
        PAPER_PARAMETERS[depth, placement, se], rel=0.02
    )


@pytest.mark.parametrize("depth,placement,se", TABLE_13)
def test_parameter_counts_match_table_13(depth, placement, se):
    with torch.device("meta"):
        model = lambda_resnet(depth, placement=placement, se=se, num_classes=1000)
    assert parameters_in_millions(model) == pytest.approx(
        PAPER_PARAMETERS[depth, placement, se], rel=0.05
    )


def test_paper_placement_of_lambda_blocks():
    placement = resolve_placement(152, "paper")
    assert placement["res4"] == {5, 10, 15, 20, 25, 30}
    assert placement["res5"] == {1, 2, 3} and not placement["res2"] and not placement["res3"]
    model = lambda_resnet(101, width_multiplier=0.25, scope=3)
    placed = [i + 1 for i, block in enumerate(model.res4) if isinstance(block.mixer, LambdaLayer)]
    assert placed == [6, 12, 18]
    assert all(isinstance(block.mixer, LambdaLayer) for block in model.res5)
    assert resolve_placement(50, "ccll")["res4"] == set(range(1, 7))
    assert not any(resolve_placement(50, "none").values())
    assert resolve_placement(50, "Paper") == resolve_placement(50, "paper")  # like the letters


def test_resnet_rs_details():
    model = lambda_resnet(50, placement="none", width_multiplier=0.25)
    # Stem: 3x3 convs, the last one strided instead of a max-pool.
    kernels = [(conv.kernel_size, conv.stride) for conv in model.stem.convs]
    assert kernels == [((3, 3), (2, 2)), ((3, 3), (1, 1)), ((3, 3), (1, 1)), ((3, 3), (2, 2))]
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())
    # ResNet-D shortcut: average pooling before the 1x1 projection of a strided block.
    first = model.res3[0]
    assert isinstance(first.shortcut[0], torch.nn.AvgPool2d) and first.mixer.stride == (2, 2)
    # Last BN gamma of every bottleneck starts at zero.
    for stage in (model.res2, model.res3, model.res4, model.res5):
        for block in stage:
            assert torch.count_nonzero(block.conv3.norm.weight) == 0


def test_lambda_block_downsamples_by_average_pooling():
    model = lambda_resnet(26, placement="CCCL", width_multiplier=0.25, scope=3)
    layer = model.res5[0].mixer
    assert isinstance(layer, LambdaLayer) and layer.stride == 2
    assert isinstance(layer.pool, torch.nn.AvgPool2d) and layer.pool.kernel_size == 3


def test_paper_init_holds_inside_a_built_lambda_resnet():
    model = lambda_resnet(26, placement="paper")
    layer = model.res5[1].mixer  # width 512
    width = 512
    assert layer.to_queries.weight.std().item() == pytest.approx((16 * width) ** -0.5, rel=0.05)
    assert layer.to_keys.weight.std().item() == pytest.approx(width**-0.5, rel=0.05)
    assert layer.to_values.weight.std().item() == pytest.approx(width**-0.5, rel=0.05)
    assert layer.position_embedding.weight.std().item() == pytest.approx(1.0, rel=0.05)
    # The backbone's He init (fan-out) would have given the keys projection an 8x larger std.
    he_std = (2 / layer.to_keys.out_channels) ** 0.5
    assert layer.to_keys.weight.std().item() < he_std / 5


@pytest.mark.parametrize("depth", sorted(BLOCKS_PER_STAGE))
def test_output_shape_matches_outputs_for_every_depth(depth):
    model = LambdaResNetBackbone(
        depth, width_multiplier=0.25, scope=3, out_features=["stem", "res2", "res3", "res4", "res5"]
    ).eval()
    with torch.no_grad():
        outputs = model(torch.randn(1, 3, 64, 96))
    shapes = model.output_shape()
    assert list(outputs) == list(shapes)
    for name, spec in shapes.items():
        assert outputs[name].shape == (1, spec.channels, 64 // spec.stride, 96 // spec.stride)
    assert shapes["res5"].channels == 512 and shapes["res5"].stride == 32


def test_aft_conv_blocks_go_where_the_placement_puts_lambda_blocks():
    from lambda_det.layers import AFTConv

    model = lambda_resnet(101, mixer="aft_conv", width_multiplier=0.25, heads=4, window_size=5)
    placed = [i + 1 for i, block in enumerate(model.res4) if isinstance(block.mixer, AFTConv)]
    assert placed == [6, 12, 18] and all(isinstance(b.mixer, AFTConv) for b in model.res5)
    assert not any(isinstance(m, LambdaLayer) for m in model.modules())
    assert model.res5[0].mixer.stride == 2 and model.res5[0].mixer.window_size == 5
    # The AFT init (gain and shift 0) survives the backbone's init loop.
    assert torch.count_nonzero(model.res5[1].mixer.position_gain) == 0
    outputs = model(torch.randn(1, 3, 64, 64))
    outputs["res5"].sum().backward()
    with pytest.raises(
        ValueError, match="res2 block 1 .'aft_conv' mixer, width 16.*not divisible by heads=3"
    ):
        lambda_resnet(50, placement="LLLL", mixer="aft_conv", width_multiplier=0.25, heads=3)
    with pytest.raises(
        ValueError,
        match="unknown mixer 'mlp'; the registered mixers are 'aft_conv', 'conv', 'lambda'",
    ):
        lambda_resnet(50, mixer="mlp")


def test_classifier_head_and_shared_embeddings():
    model = lambda_resnet(
        26,
        placement="CCLL",
        num_classes=10,
        width_multiplier=0.25,
        scope=3,
        share_position_embeddings=True,
    )
    layers = [m for m in model.modules() if isinstance(m, LambdaLayer)]
    assert len(layers) == 4 and len({id(layer.position_embedding.weight) for layer in layers}) == 1
    logits = model(torch.randn(2, 3, 64, 64))["linear"]
    assert logits.shape == (2, 10)
    # The shared table stays trainable while a trained stage (res5 here) uses it.
    shared = layers[0].position_embedding.weight
    assert model.freeze(4) is model and shared.requires_grad
    assert not any(p.requires_grad for p in model.res4.parameters() if p is not shared)
    assert not model.freeze(5).res5[0].conv1.weight.requires_grad and not shared.requires_grad


@pytest.mark.parametrize("model_class", [LambdaResNet, LambdaResNetBackbone])
def test_freeze_at_and_norms(model_class):
    model = model_class(26, width_multiplier=0.25, scope=3, freeze_at=2)
    assert not any(p.requires_grad for p in model.stem.parameters())
    assert not any(p.requires_grad for p in model.res2.parameters())
    assert all(p.requires_grad for p in model.res3.parameters())
    for norm in ("GN", "FrozenBN", "SyncBN"):
        net = model_class(26, width_multiplier=0.25, scope=3, norm=norm).eval()
        assert net(torch.randn(1, 3, 64, 64))["res5"].shape == (1, 512, 2, 2)


def test_frozen_stages_freeze_their_batch_norms():
    """The torch-only model freezes into torchvision's FrozenBatchNorm2d, the detectron2 backbone
    into detectron2's, holding the statistics the BatchNorm had."""
    torch.manual_seed(0)
    model = LambdaResNet(26, width_multiplier=0.25, scope=3)
    norm = model.res2[0].conv1.norm
    with torch.no_grad():
        norm.running_mean.uniform_()
        norm.weight.uniform_()
    statistics = norm.running_mean.clone(), norm.weight.clone()
    assert isinstance(norm, torch.nn.BatchNorm2d)  # negative control: not frozen before
    model.freeze(2)
    frozen = model.res2[0].conv1.norm
    assert isinstance(frozen, torchvision.ops.FrozenBatchNorm2d)
    assert torch.equal(frozen.running_mean, statistics[0])
    assert torch.equal(frozen.weight, statistics[1])
    assert isinstance(model.res3[0].conv1.norm, torch.nn.BatchNorm2d)  # not frozen
    backbone = LambdaResNetBackbone(26, width_multiplier=0.25, scope=3, freeze_at=2)
    assert isinstance(backbone.stem.convs[0].norm, FrozenBatchNorm2d)
    assert isinstance(backbone.res2[1].conv3.norm, FrozenBatchNorm2d)
    assert isinstance(backbone.res3[0].conv1.norm, torch.nn.BatchNorm2d)


def test_a_norm_callable_is_every_norm():
    model = lambda_resnet(
        26,
        width_multiplier=0.25,
        scope=3,
        placement="CCCL",
        norm=lambda channels: torch.nn.GroupNorm(2, channels),
    )
    norms = [
        module
        for module in model.modules()
        if isinstance(module, (torch.nn.GroupNorm, torch.nn.modules.batchnorm._NormBase))
    ]
    assert norms and all(
        type(norm) is torch.nn.GroupNorm and norm.num_groups == 2 for norm in norms
    )
    layer = model.res5[0].mixer  # the lambda layer's query and value norms too
    assert type(layer.query_norm) is torch.nn.GroupNorm


class PatchifyStem(torch.nn.Sequential):
    """A stem of another kind: one 4x4 conv of stride 4 and a norm."""

    def __init__(self, in_channels, out_channels, norm):
        super().__init__(
            torch.nn.Conv2d(in_channels, out_channels, 4, stride=4), norm(out_channels)
        )


def test_a_stem_of_another_kind():
    model = lambda_resnet(26, width_multiplier=0.25, scope=3, stem=PatchifyStem, norm="GN")
    assert isinstance(model.stem, PatchifyStem) and isinstance(model.stem[1], torch.nn.GroupNorm)
    outputs = model(torch.randn(2, 3, 64, 64))
    assert outputs["res2"].shape == (2, 64, 16, 16) and outputs["res5"].shape == (2, 512, 2, 2)
    default = lambda_resnet(26, width_multiplier=0.25, scope=3)
    assert type(default.stem) is ResNetRSStem  # the paper's; state_dict keys: test_state_dict_keys


@pytest.mark.parametrize("mixer", ["lambda", "aft_conv"])
def test_empty_norm_means_no_norm(mixer):
    """detectron2's convention (MODEL.RESNETS.NORM ""): no norm anywhere, the lambda layers'
    queries and values included."""
    net = lambda_resnet(26, width_multiplier=0.25, norm="", mixer=mixer).train()
    norms = (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm)
    assert not any(isinstance(module, norms) for module in net.modules())
    outputs = net(torch.randn(2, 3, 64, 64))
    assert outputs["res5"].shape == (2, 512, 2, 2)
    sum(output.sum() for output in outputs.values()).backward()


def test_empty_norm_from_a_config():
    cfg = lambda_det.get_cfg()
    cfg.MODEL.RESNETS.NORM = ""
    cfg.MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER = 0.25
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64  # what the C4 heads of the default config take
    backbone = BACKBONE_REGISTRY.get("build_lambda_resnet_backbone")(cfg, ShapeSpec(channels=3))
    layers = [module for module in backbone.modules() if isinstance(module, LambdaLayer)]
    assert layers and all(type(layer.query_norm) is torch.nn.Identity for layer in layers)
    assert backbone(torch.randn(1, 3, 64, 64))["res4"].shape == (1, 256, 4, 4)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(depth=77), ValueError, "depth must be one of .* got 77"),
        (dict(depth=50, placement="CCXL"), ValueError, "got 'CCXL'"),
        (
            dict(depth=50, placement={"res4": [7]}),
            ValueError,
            "placement block 7 is past the end of res4, which has 6",
        ),
        (
            dict(depth=50, placement="LLLL", width_multiplier=0.3),
            ValueError,
            "res2 block 1 .'lambda' mixer, width 19, width_multiplier=0.3.: out_channels=19 is not "
            "divisible by heads=4",
        ),
        (
            dict(depth=50, heads=3),
            ValueError,
            "res4 block 3 .* width 256.* not divisible by heads=3",
        ),
        (
            dict(depth=50, colour="red"),
            TypeError,
            "unknown options \\['colour'\\] for mixer 'lambda'; its options are .'heads', 'dim_k'",
        ),
        (
            dict(depth=50, mixer="aft_conv", scope=5),
            TypeError,
            "unknown options \\['scope'\\] for mixer 'aft_conv'; its options are "
            ".'heads', 'window_size'.$",
        ),
        (dict(depth=50, heads=0), ValueError, "heads must be an integer >= 1, got 0"),
        (
            dict(depth=50, mixer="aft_conv", heads=0),
            ValueError,
            "heads must be an integer >= 1, got 0",
        ),
        (
            dict(depth=50, norm="naiveSyncBN"),
            ValueError,
            "norm must be one of \\['BN', 'SyncBN', 'FrozenBN', 'GN'\\], \"\" for none, "
            "or a callable .*"
            "got 'naiveSyncBN' .LambdaResNetBackbone, the detectron2 backbone, takes detectron2's",
        ),
    ],
)
def test_bad_arguments_name_the_value(kwargs, error, message):
    with pytest.raises(error, match=message):
        lambda_resnet(**kwargs)


def test_the_detectron2_backbone_takes_detectron2_norms():
    backbone = LambdaResNetBackbone(26, width_multiplier=0.25, scope=3, norm="naiveSyncBN")
    assert type(backbone.res2[0].conv1.norm).__name__ == "NaiveSyncBatchNorm"
    assert type(backbone.res2[0].conv1.norm).__module__.startswith("detectron2.")
    with pytest.raises(ValueError, match="norm must be a detectron2 norm .* got 'BNN'"):
        LambdaResNetBackbone(50, norm="BNN")


def test_forgotten_add_config_is_named_by_the_builder(tmp_path):
    config = tmp_path / "lambda.yaml"
    config.write_text("MODEL:\n  LAMBDA_RESNET:\n    DEPTH: 101\n")
    # yacs' own error for the file (lambda_det patches nothing in yacs); the builder says how.
    cfg = get_detectron2_cfg()
    with pytest.raises(KeyError, match="Non-existent config key: MODEL.LAMBDA_RESNET"):
        cfg.merge_from_file(str(config))
    cfg.MODEL.BACKBONE.NAME = "build_lambda_resnet_fpn_backbone"
    with pytest.raises(KeyError, match="add_lambda_resnet_config"):
        build_model(cfg)
    # With the node added, the same file merges.
    cfg = lambda_det.add_lambda_resnet_config(get_detectron2_cfg())
    cfg.merge_from_file(str(config))
    assert cfg.MODEL.LAMBDA_RESNET.DEPTH == 101
    assert "build_lambda_resnet_fpn_backbone" in BACKBONE_REGISTRY
    # Adding again keeps what is there; lambda_det's run keys are added apart, as a detectron2
    # project's are, and keep the backbone's.
    lambda_det.add_lambda_resnet_config(cfg)
    assert cfg.MODEL.LAMBDA_RESNET.DEPTH == 101 and "LSJ" not in cfg.INPUT
    lambda_det.add_lambda_det_config(cfg)
    assert cfg.MODEL.LAMBDA_RESNET.DEPTH == 101 and cfg.INPUT.LSJ.IMAGE_SIZE == 1024


def small_lambda_cfg(base: str, backbone: str):
    cfg = lambda_det.get_cfg()
    cfg.merge_from_file(str(CONFIGS / base))
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.WEIGHTS = ""
    cfg.MODEL.BACKBONE.NAME = backbone
    cfg.MODEL.BACKBONE.FREEZE_AT = 0
    cfg.MODEL.LAMBDA_RESNET.DEPTH = 26
    cfg.MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER = 0.25
    cfg.MODEL.LAMBDA_RESNET.SCOPE = 5
    cfg.MODEL.LAMBDA_RESNET.OUT_FEATURES = list(cfg.MODEL.FPN.IN_FEATURES)
    cfg.MODEL.FPN.OUT_CHANNELS = 32
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = 3
    cfg.MODEL.RETINANET.NUM_CLASSES = 3
    cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 32
    cfg.MODEL.RPN.BATCH_SIZE_PER_IMAGE = 32
    cfg.MODEL.ROI_BOX_HEAD.FC_DIM = 64
    cfg.MODEL.ROI_MASK_HEAD.CONV_DIM = 32
    cfg.MODEL.SEM_SEG_HEAD.NUM_CLASSES = 4
    cfg.MODEL.SEM_SEG_HEAD.CONVS_DIM = 32
    return cfg


def cascade(cfg):
    cfg.MODEL.ROI_HEADS.NAME = "CascadeROIHeads"
    cfg.MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG = True
    return cfg


ARCHITECTURES = {
    "mask_rcnn": (
        "Base-RCNN-FPN.yaml",
        "build_lambda_resnet_fpn_backbone",
        lambda cfg: cfg.merge_from_list(["MODEL.MASK_ON", "True"]) or cfg,
    ),
    "faster_rcnn": ("Base-RCNN-FPN.yaml", "build_lambda_resnet_fpn_backbone", lambda cfg: cfg),
    "cascade_rcnn": ("Base-RCNN-FPN.yaml", "build_lambda_resnet_fpn_backbone", cascade),
    "retinanet": (
        "Base-RetinaNet.yaml",
        "build_retinanet_lambda_resnet_fpn_backbone",
        lambda cfg: cfg,
    ),
    "panoptic_fpn": ("Base-Panoptic-FPN.yaml", "build_lambda_resnet_fpn_backbone", lambda cfg: cfg),
    "mask_rcnn_aft_conv": (
        "Base-RCNN-FPN.yaml",
        "build_lambda_resnet_fpn_backbone",
        lambda cfg: (
            cfg.merge_from_list(
                [
                    "MODEL.MASK_ON",
                    "True",
                    "MODEL.LAMBDA_RESNET.MIXER",
                    "aft_conv",
                    "MODEL.LAMBDA_RESNET.AFT_CONV.HEADS",
                    "4",
                ]
            )
            or cfg
        ),
    ),
}


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_detectron2_pipelines_train_and_infer_with_a_lambda_resnet(architecture):
    base, backbone, adjust = ARCHITECTURES[architecture]
    model = build_model(adjust(small_lambda_cfg(base, backbone)))
    bottom_up = model.backbone.bottom_up
    assert isinstance(bottom_up, LambdaResNet)
    with torch.no_grad():  # zero-init residual branches pass no gradient inward at step 0
        for module in bottom_up.modules():
            if hasattr(module, "conv3"):
                module.conv3.norm.weight.fill_(1.0)
    model.train()
    with EventStorage():
        losses = model(tiny_detection_batch(with_sem_seg=architecture == "panoptic_fpn"))
    total = sum(losses.values())
    assert torch.isfinite(total)
    total.backward()
    mixer = bottom_up.res5[0].mixer
    if isinstance(mixer, LambdaLayer):
        assert mixer.position_embedding.weight.grad.abs().sum() > 0
        assert mixer.to_queries.weight.grad.abs().sum() > 0
    else:
        assert mixer.position_shift.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        outputs = model(tiny_detection_batch())
    assert len(outputs) == 2
    key = "panoptic_seg" if architecture == "panoptic_fpn" else "instances"
    assert key in outputs[0]


def saved_tensor_bytes(model, x) -> int:
    """Bytes of the tensors autograd keeps for backward outside checkpointed regions."""
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(x)["res5"].sum().backward()
    return sum(saved)


@pytest.mark.parametrize("drop_path_rate", [0.0, 0.5])
def test_grad_checkpointing_gives_the_same_outputs_and_gradients_with_less_kept(drop_path_rate):
    torch.manual_seed(0)
    model = lambda_resnet(26, placement="c4", drop_path_rate=drop_path_rate).double().train()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)

    def outputs_and_gradients(checkpointing):
        model.grad_checkpointing = checkpointing
        model.zero_grad()
        torch.manual_seed(1)  # stochastic depth draws the same blocks
        outputs = model(x)
        sum(output.square().sum() for output in outputs.values()).backward()
        return outputs, {name: p.grad.clone() for name, p in model.named_parameters()}

    plain, plain_grads = outputs_and_gradients(False)
    kept, kept_grads = outputs_and_gradients(True)
    for name in plain:
        torch.testing.assert_close(kept[name], plain[name], rtol=1e-12, atol=0, msg=name)
    for name in plain_grads:
        torch.testing.assert_close(kept_grads[name], plain_grads[name], rtol=1e-10, atol=1e-12)
    model.grad_checkpointing = False
    without = saved_tensor_bytes(model, x)
    model.grad_checkpointing = True
    assert saved_tensor_bytes(model, x) < without / 5


def test_grad_checkpointing_from_the_config_and_not_in_eval_or_torchscript():
    cfg = lambda_det.get_cfg()
    cfg.merge_from_file(str(CONFIGS / "Demo/lambda_r26_shapes.yaml"))
    cfg.MODEL.LAMBDA_RESNET.GRAD_CHECKPOINTING = True
    backbone = BACKBONE_REGISTRY.get("build_lambda_resnet_backbone")(cfg, ShapeSpec(channels=3))
    assert backbone.grad_checkpointing
    with torch.no_grad():
        assert not backbone._checkpointing()
    scripted = torch.jit.script(lambda_resnet(26, placement="c4", grad_checkpointing=True).eval())
    assert set(scripted(torch.randn(1, 3, 64, 64))) == {"res2", "res3", "res4", "res5"}
