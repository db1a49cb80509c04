"""timm's pretrained lambda models as detectron2 backbones: features equal to timm's own
``features_only`` model with the same weights, loaded through MODEL.WEIGHTS (a local file or
``timm://NAME`` from the hub cache) and counted; freezing, norms, activation checkpointing."""

import functools
import logging

import pytest
import torch

timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")

from conftest import CONFIGS, overrides
from detectron2.modeling import build_backbone, build_model

from lambda_det.checkpoint import AtomicCheckpointer, CorruptCheckpointError, check_weights
from lambda_det.checkpoint.timm_weights import timm_hub_file
from lambda_det.modeling.timm_backbone import TimmBackbone
from lambda_det.run_config import get_cfg
from lambda_det.utils.errors import MissingFileError, UserError

LAMBDA_26T = "lambda_resnet26t.c1_in1k"


def timm_weights(name: str, folder, suffix: str = ".safetensors"):
    """A file of timm's weights of ``name`` as timm's hub holds them (a state dict of the
    classifier), with BatchNorm statistics and affine weights that are not the initial ones."""
    generator = torch.Generator().manual_seed(0)
    model = timm.create_model(name, pretrained=False)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(generator=generator)
                module.running_var.uniform_(0.5, 2.0, generator=generator)
                module.weight.normal_(1.0, 0.1, generator=generator)
                module.bias.normal_(generator=generator)
    state_dict = {key: value.contiguous() for key, value in model.state_dict().items()}
    path = folder / f"{name}{suffix}"
    if suffix == ".safetensors":
        safetensors_torch.save_file(state_dict, str(path))
    else:
        torch.save(state_dict, path)
    return path


def timm_cfg(name: str = LAMBDA_26T, backbone: str = "build_timm_fpn_backbone"):
    """detectron2's Mask R-CNN FPN config (lambda_det's copy of Base-RCNN-FPN) on the timm
    backbone ``name``."""
    cfg = get_cfg()
    cfg.merge_from_file(str(CONFIGS / "Base-RCNN-FPN.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.NAME = backbone
    cfg.MODEL.TIMM.NAME = name
    return cfg


def relative_differences(ours: dict, theirs: list) -> list:
    return [
        ((ours[name] - feature).abs().max() / feature.abs().max()).item()
        for name, feature in zip(ours, theirs)
    ]


@pytest.mark.parametrize(
    "name,suffix",
    [
        (LAMBDA_26T, ".safetensors"),
        (LAMBDA_26T, ".pth"),
        pytest.param("lambda_resnet50ts.a1h_in1k", ".safetensors", marks=pytest.mark.slow),
    ],
)
def test_features_equal_timms_features_only_model_with_the_same_weights(
    tmp_path, caplog, name, suffix
):
    path = timm_weights(name, tmp_path, suffix)
    model = build_model(timm_cfg(name)).eval()
    fresh = build_model(timm_cfg(name)).eval()
    with caplog.at_level(logging.INFO, logger="fvcore.common.checkpoint"):
        AtomicCheckpointer(model, require="backbone").load(str(path), checkpointables=[])
    backbone_weights = [
        key
        for key in model.state_dict()
        if key.startswith("backbone.bottom_up.") and not key.endswith("num_batches_tracked")
    ]
    assert (
        f"loaded {len(backbone_weights)} of {len(backbone_weights)} backbone weights" in caplog.text
    )
    reference = timm.create_model(
        name, pretrained=True, features_only=True, pretrained_cfg_overlay={"file": str(path)}
    ).eval()
    images = torch.randn(2, 3, 96, 128, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model.backbone.bottom_up(images)
        theirs = reference(images)[1:]  # res2 ... res5 (timm's first feature is at stride 2)
        untrained = fresh.backbone.bottom_up(images)
    assert list(ours) == ["res2", "res3", "res4", "res5"]
    assert max(relative_differences(ours, theirs)) < 1e-4  # FrozenBN's float rounding
    # Negative control: the backbone without the file's weights gives other features.
    assert min(relative_differences(untrained, theirs)) > 1e-2


def test_shapes_come_from_timms_feature_info():
    reference = timm.create_model(LAMBDA_26T, pretrained=False, features_only=True)
    backbone = TimmBackbone(LAMBDA_26T, ["res3", "res5"])
    shapes = backbone.output_shape()
    assert {name: (shape.channels, shape.stride) for name, shape in shapes.items()} == {
        "res3": (reference.feature_info.channels()[2], 8),
        "res5": (reference.feature_info.channels()[4], 32),
    }
    features = backbone(torch.randn(1, 3, 64, 96))
    assert {name: tuple(feature.shape) for name, feature in features.items()} == {
        "res3": (1, shapes["res3"].channels, 8, 12),
        "res5": (1, shapes["res5"].channels, 2, 3),
    }


def test_every_builder_builds():
    images = torch.randn(1, 3, 64, 64)
    plain = build_backbone(timm_cfg(backbone="build_timm_backbone"))
    assert set(plain(images)) == {"res2", "res3", "res4", "res5"}
    cfg = timm_cfg(backbone="build_retinanet_timm_fpn_backbone")
    cfg.MODEL.FPN.IN_FEATURES = ["res3", "res4", "res5"]
    assert set(build_backbone(cfg)(images)) == {"p3", "p4", "p5", "p6", "p7"}


@pytest.mark.parametrize(
    "keys,fragments",
    [
        ({"MODEL.TIMM.NAME": "lambda_resnet27"}, ["'lambda_resnet27' is not a timm model"]),
        (
            {"MODEL.TIMM.NAME": "lambda_resnet26rpt_256.c1_in1k"},
            ["takes only 256 x 256 images", "lambda_resnet26t.c1_in1k"],
        ),
        ({"MODEL.TIMM.OUT_FEATURES": ["res6"]}, ["res1, res2, res3, res4, res5"]),
        ({"MODEL.TIMM.NORM": "GN"}, ["MODEL.TIMM.NORM 'GN'", "FrozenBN"]),
        ({"MODEL.BACKBONE.FREEZE_AT": 6}, ["FREEZE_AT 6 is beyond", "from 2 to 5"]),
        ({"MODEL.TIMM.NAME": ""}, ["needs MODEL.TIMM.NAME"]),
        ({"MODEL.FPN.IN_FEATURES": ["res2", "res6"]}, ["needs ['res6']"]),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(keys, fragments):
    cfg = timm_cfg()
    for key, value in keys.items():
        node, _, leaf = key.rpartition(".")
        functools.reduce(getattr, node.split("."), cfg)[leaf] = value
    with pytest.raises(UserError) as error:
        build_backbone(cfg)
    message = str(error.value)
    assert "\n" not in message and all(fragment in message for fragment in fragments), message


@pytest.mark.parametrize("norm", ["BN", "FrozenBN"])
def test_freeze_at_freezes_the_stem_and_res2_as_detectron2_counts(norm):
    backbone = TimmBackbone(LAMBDA_26T, freeze_at=2, norm=norm)
    frozen = {name for name, p in backbone.model.named_parameters() if not p.requires_grad}
    trained = {name for name, p in backbone.model.named_parameters() if p.requires_grad}
    assert frozen and all(name.startswith(("stem.", "stages.0.")) for name in frozen)
    assert trained and not any(name.startswith(("stem.", "stages.0.")) for name in trained)
    batch_norms = {
        name: type(module).__name__
        for name, module in backbone.model.named_modules()
        if "BatchNorm" in type(module).__name__
    }
    assert batch_norms["stem.conv1.bn"] == "FrozenBatchNormAct2d"
    trained_norm = "FrozenBatchNormAct2d" if norm == "FrozenBN" else "BatchNormAct2d"
    assert batch_norms["stages.1.0.conv1_1x1.bn"] == trained_norm
    assert not any(p.requires_grad for p in TimmBackbone(LAMBDA_26T, freeze_at=5).parameters())
    assert all(p.requires_grad for p in TimmBackbone(LAMBDA_26T, norm="BN").parameters())


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = TimmBackbone(LAMBDA_26T, ["res4"])
    checkpointed = TimmBackbone(LAMBDA_26T, ["res4"], grad_checkpointing=True)
    checkpointed.load_state_dict(plain.state_dict())
    images = torch.randn(2, 3, 64, 64)
    gradients = []
    for backbone in (plain, checkpointed):
        backbone.zero_grad()
        backbone(images)["res4"].square().mean().backward()
        gradients.append({n: p.grad for n, p in backbone.named_parameters() if p.grad is not None})
    assert checkpointed.model.grad_checkpointing and not plain.model.grad_checkpointing
    assert gradients[0].keys() == gradients[1].keys() and gradients[0]
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, rtol=1e-5, atol=1e-7)


def fake_hub_cache(root, name: str, weights) -> None:
    """The Hugging Face hub cache as timm's download leaves it: refs/main names a snapshot that
    holds model.safetensors."""
    repo = root / f"models--timm--{name}"
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    (snapshot / "model.safetensors").write_bytes(weights.read_bytes())


def test_timm_hub_file_is_the_cached_file_and_one_line_when_missing(tmp_path):
    weights = timm_weights(LAMBDA_26T, tmp_path)
    cache = tmp_path / "cache"
    with pytest.raises(MissingFileError) as error:
        timm_hub_file(LAMBDA_26T, cache_dir=str(cache), local_files_only=True)
    assert "not in the Hugging Face hub cache" in str(error.value)
    assert "timm.create_model('lambda_resnet26t.c1_in1k', pretrained=True)" in str(error.value)
    fake_hub_cache(cache, LAMBDA_26T, weights)
    found = timm_hub_file(LAMBDA_26T, cache_dir=str(cache), local_files_only=True)
    assert open(found, "rb").read() == weights.read_bytes()
    with pytest.raises(UserError, match="timm has no pretrained weights on the hub for 'nope'"):
        timm_hub_file("nope", cache_dir=str(cache), local_files_only=True)


def test_timm_prefix_loads_through_detectron2s_path_manager(tmp_path, monkeypatch, caplog):
    from lambda_det.checkpoint import timm_weights as module

    weights = timm_weights(LAMBDA_26T, tmp_path)
    cache = tmp_path / "cache"
    fake_hub_cache(cache, LAMBDA_26T, weights)
    real = module.timm_hub_file
    monkeypatch.setattr(
        module,
        "timm_hub_file",
        lambda name: real(name, cache_dir=str(cache), local_files_only=True),
    )
    check_weights(f"timm://{LAMBDA_26T}")
    model = build_model(timm_cfg())
    with caplog.at_level(logging.INFO, logger="fvcore.common.checkpoint"):
        AtomicCheckpointer(model, require="backbone").load(f"timm://{LAMBDA_26T}")
    assert "loaded 185 of 185 backbone weights" in caplog.text


def test_a_file_that_is_not_safetensors_is_one_line(tmp_path):
    fake = tmp_path / "model.safetensors"
    fake.write_bytes(b"\xff" * 64)
    with pytest.raises(CorruptCheckpointError, match="is not a safetensors file"):
        AtomicCheckpointer(build_model(timm_cfg())).load(str(fake))


@pytest.mark.slow
@pytest.mark.e2e
def test_a_fine_tuning_config_trains_evaluates_and_predicts_at_demo_size(
    tmp_path, small_shapes, small_datasets_root, capsys
):
    """The shipped timm_lambda_resnet26t_mask_rcnn_1x on the bundled shapes data at 128 px (from
    random weights: no hub here), then --eval-only, predict and the export of its run, as for a
    LambdaResNet."""
    from lambda_det.cli import export_model, predict, train_net

    run = tmp_path / "run"
    small = overrides(
        {
            "MODEL.DEVICE": "cpu",
            "MODEL.WEIGHTS": "",
            "MODEL.ROI_HEADS.NUM_CLASSES": 3,
            "DATASETS.TRAIN": "('lambda_det_shapes_train',)",
            "DATASETS.TEST": "('lambda_det_shapes_val',)",
            "SOLVER.IMS_PER_BATCH": 2,
            "SOLVER.MAX_ITER": 2,
            "SOLVER.STEPS": "()",
            "SOLVER.WARMUP_ITERS": 1,
            "INPUT.MIN_SIZE_TRAIN": "(128,)",
            "INPUT.MAX_SIZE_TRAIN": 128,
            "INPUT.MIN_SIZE_TEST": 128,
            "INPUT.MAX_SIZE_TEST": 128,
            "DATALOADER.NUM_WORKERS": 0,
            "MODEL.RPN.POST_NMS_TOPK_TEST": 50,
            "TEST.DETECTIONS_PER_IMAGE": 20,
        }
    )
    config = "timm_lambda_resnet26t_mask_rcnn_1x"
    assert train_net.main(["--config", config, *small, "OUTPUT_DIR", str(run)]) == 0
    assert (run / "model_final.pth").is_file() and (run / "inference").is_dir()
    saved = str(run / "config.yaml")
    evaluation = tmp_path / "evaluation"
    argv = ["--config", saved, "--eval-only", "MODEL.WEIGHTS", str(run / "model_final.pth")]
    assert train_net.main([*argv, "OUTPUT_DIR", str(evaluation)]) == 0
    assert "loaded 185 of 185 backbone weights" in "".join(capsys.readouterr())
    predicted = tmp_path / "predicted"
    from lambda_det.data.shapes import VERSION

    images = small_datasets_root / f"lambda_det_shapes_{VERSION}" / "val"
    argv = ["--config", saved, "--input", str(images), "--output", str(predicted)]
    assert predict.main([*argv, "MODEL.WEIGHTS", str(run / "model_final.pth")]) == 0
    assert (predicted / "predictions.json").is_file()
    exported = tmp_path / "model.ts"
    argv = ["--config", saved, "--format", "torchscript", "--output", str(exported)]
    assert export_model.main([*argv, "MODEL.WEIGHTS", str(run / "model_final.pth")]) == 0
    assert exported.is_file()
