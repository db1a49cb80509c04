"""The shipped configs: Table 14 and the demo, the paper's recipe and schedule, their backbones'
numbers, names, the CPU norm swap and how a saved config is compared."""

from pathlib import Path

import pytest
import torch
from conftest import CONFIGS
from detectron2.engine import DefaultTrainer
from detectron2.modeling import build_model

import lambda_det.modeling
from lambda_det.cli import demo
from lambda_det.config import adapt_norms_to_device, resolve_config_file
from lambda_det.config.lazy import load_lazy_config

SHIPPED_CONFIGS = sorted(str(p.relative_to(CONFIGS)) for p in CONFIGS.rglob("*.yaml"))
# Table 14's configs; the timm_* ones fine-tune timm's ImageNet models on detectron2's schedules.
PAPER_CONFIGS = [
    name
    for name in SHIPPED_CONFIGS
    if name.startswith("COCO-InstanceSegmentation") and not Path(name).name.startswith("timm_")
]
FINE_TUNING_CONFIGS = [name for name in SHIPPED_CONFIGS if Path(name).name.startswith("timm_")]


def load_config(relative: str):
    cfg = lambda_det.get_cfg()
    cfg.merge_from_file(str(CONFIGS / relative))
    return cfg


def test_every_table_14_config_is_shipped():
    names = {Path(p).stem for p in PAPER_CONFIGS}
    assert {
        "lambda_r101_mask_rcnn",
        "lambda_r152_mask_rcnn",
        "r101_mask_rcnn",
        "r101_se_mask_rcnn",
        "r152_mask_rcnn",
        "r152_se_mask_rcnn",
    } <= names


FPN_P2_P6 = {"p2": (256, 4), "p3": (256, 8), "p4": (256, 16), "p5": (256, 32), "p6": (256, 64)}
FPN_P3_P7 = {"p3": (256, 8), "p4": (256, 16), "p5": (256, 32), "p6": (256, 64), "p7": (256, 128)}
RES2_RES5 = {"res2": (256, 4), "res3": (512, 8), "res4": (1024, 16), "res5": (2048, 32)}
RES3_RES5 = {name: RES2_RES5[name] for name in ("res3", "res4", "res5")}
DEMO_FPN = {name: (32, stride) for name, (_, stride) in FPN_P2_P6.items()}
DEMO_RES = {name: (channels // 2, stride) for name, (channels, stride) in RES2_RES5.items()}

# Per shipped config: the backbone's parameters, its outputs and its bottom-up's outputs as
# {name: (channels, stride)} from output_shape(). The counts are what the code builds, taken once
# from sum(p.numel() for p in build_backbone(cfg).parameters()) (shared parameters once); the
# paper's own counts are checked against PAPER_PARAMETERS in test_lambda_resnet.py.
SHIPPED_BACKBONES = {
    "Base-Panoptic-FPN.yaml": (26_799_296, FPN_P2_P6, RES2_RES5),  # detectron2's R-50
    "Base-Paper-MaskRCNN-LSJ.yaml": (19_634_592, FPN_P2_P6, RES2_RES5),  # LambdaResNet-50
    "Base-RCNN-FPN.yaml": (26_799_296, FPN_P2_P6, RES2_RES5),  # detectron2's R-50
    "Base-RetinaNet.yaml": (31_452_352, FPN_P3_P7, RES3_RES5),  # detectron2's R-50
    "COCO-Detection/lambda_r101_faster_rcnn.yaml": (37_538_240, FPN_P2_P6, RES2_RES5),
    "COCO-Detection/lambda_r101_retinanet.yaml": (42_190_784, FPN_P3_P7, RES3_RES5),
    "COCO-InstanceSegmentation/aft_conv_r101_mask_rcnn.yaml": (40_032_368, FPN_P2_P6, RES2_RES5),
    "COCO-InstanceSegmentation/lambda_r101_mask_rcnn.yaml": (37_538_240, FPN_P2_P6, RES2_RES5),
    "COCO-InstanceSegmentation/lambda_r152_mask_rcnn.yaml": (51_549_168, FPN_P2_P6, RES2_RES5),
    "COCO-InstanceSegmentation/r101_mask_rcnn.yaml": (45_902_816, FPN_P2_P6, RES2_RES5),
    "COCO-InstanceSegmentation/r101_se_mask_rcnn.yaml": (64_916_128, FPN_P2_P6, RES2_RES5),
    "COCO-InstanceSegmentation/r152_mask_rcnn.yaml": (61_546_464, FPN_P2_P6, RES2_RES5),
    "COCO-InstanceSegmentation/r152_se_mask_rcnn.yaml": (87_919_008, FPN_P2_P6, RES2_RES5),
    "Base-Timm-MaskRCNN-FPN.yaml": (12_221_672, FPN_P2_P6, RES2_RES5),  # lambda_resnet26t
    "COCO-InstanceSegmentation/timm_lambda_resnet26t_mask_rcnn_1x.yaml": (
        12_221_672,
        FPN_P2_P6,
        RES2_RES5,
    ),
    "COCO-InstanceSegmentation/timm_lambda_resnet26t_mask_rcnn_3x.yaml": (
        12_221_672,
        FPN_P2_P6,
        RES2_RES5,
    ),
    "COCO-InstanceSegmentation/timm_lambda_resnet50ts_mask_rcnn_1x.yaml": (
        22_777_640,
        FPN_P2_P6,
        RES2_RES5,
    ),
    "COCO-InstanceSegmentation/timm_lambda_resnet50ts_mask_rcnn_3x.yaml": (
        22_777_640,
        FPN_P2_P6,
        RES2_RES5,
    ),
    "Demo/aft_conv_r26_shapes.yaml": (2_730_936, DEMO_FPN, DEMO_RES),
    "Demo/lambda_r26_shapes.yaml": (2_371_424, DEMO_FPN, DEMO_RES),
}


def test_every_shipped_config_has_its_backbone_numbers():
    assert sorted(SHIPPED_BACKBONES) == SHIPPED_CONFIGS


def output_shapes(backbone) -> dict:
    return {name: (spec.channels, spec.stride) for name, spec in backbone.output_shape().items()}


@pytest.mark.parametrize("relative", SHIPPED_CONFIGS)
@pytest.mark.slow
def test_every_shipped_config_builds_and_runs(relative):
    cfg = load_config(relative)
    cfg.MODEL.DEVICE = "cpu"
    adapt_norms_to_device(cfg)
    model = build_model(cfg).eval()
    parameters, outputs, bottom_up_outputs = SHIPPED_BACKBONES[relative]
    assert sum(p.numel() for p in model.backbone.parameters()) == parameters
    assert output_shapes(model.backbone) == outputs
    assert output_shapes(model.backbone.bottom_up) == bottom_up_outputs
    with torch.no_grad():
        outputs = model(
            [
                {
                    "image": torch.randint(0, 255, (3, 64, 96), dtype=torch.uint8),
                    "height": 64,
                    "width": 96,
                }
            ]
        )
    assert len(outputs) == 1


@pytest.mark.parametrize("relative", PAPER_CONFIGS)
def test_paper_recipe_is_resolved_exactly(relative):
    cfg = load_config(relative)
    solver = cfg.SOLVER
    assert (solver.IMS_PER_BATCH, solver.BASE_LR, solver.MAX_ITER) == (256, 0.32, 130000)
    assert tuple(solver.STEPS) == (117000, 123500, 126750)
    assert (solver.WARMUP_ITERS, solver.WARMUP_FACTOR, solver.GAMMA) == (1000, 0.0, 0.1)
    assert (solver.WEIGHT_DECAY, solver.WEIGHT_DECAY_NORM) == (4e-5, 0.0)
    lsj = cfg.INPUT.LSJ
    assert (lsj.ENABLED, lsj.IMAGE_SIZE, lsj.MIN_SCALE, lsj.MAX_SCALE) == (True, 1024, 0.1, 2.0)
    assert (cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST) == (1024, 1024)
    assert cfg.MODEL.WEIGHTS == "" and cfg.MODEL.BACKBONE.FREEZE_AT == 0 and cfg.MODEL.MASK_ON
    assert cfg.MODEL.LAMBDA_RESNET.NORM == "SyncBN" and cfg.MODEL.FPN.NORM == "SyncBN"
    assert cfg.MODEL.ROI_BOX_HEAD.NORM == cfg.MODEL.ROI_MASK_HEAD.NORM == "naiveSyncBN_N"
    # On 8 GPUs detectron2 keeps 4 images per GPU and scales LR and schedule linearly.
    scaled = DefaultTrainer.auto_scale_workers(cfg, 8)
    assert (scaled.SOLVER.IMS_PER_BATCH, scaled.SOLVER.MAX_ITER) == (32, 1040000)
    assert scaled.SOLVER.BASE_LR == pytest.approx(0.04)
    assert tuple(scaled.SOLVER.STEPS) == (936000, 988000, 1014000)
    assert scaled.SOLVER.WARMUP_ITERS == 8000
    assert DefaultTrainer.auto_scale_workers(cfg, 64).SOLVER.IMS_PER_BATCH == 256


@pytest.mark.parametrize(
    "relative", [name for name in SHIPPED_CONFIGS if name.startswith("COCO-Detection")]
)
def test_detection_configs_follow_the_paper_schedule(relative):
    cfg = load_config(relative)
    paper = load_config("COCO-InstanceSegmentation/lambda_r101_mask_rcnn.yaml")
    for node in (
        "SOLVER",
        "INPUT.LSJ",
        "INPUT.MIN_SIZE_TEST",
        "INPUT.MAX_SIZE_TEST",
        "MODEL.WEIGHTS",
        "MODEL.BACKBONE.FREEZE_AT",
        "MODEL.LAMBDA_RESNET.NORM",
        "MODEL.LAMBDA_RESNET.DEPTH",
        "MODEL.LAMBDA_RESNET.PLACEMENT",
        "MODEL.FPN.NORM",
    ):
        ours, theirs = cfg, paper
        for part in node.split("."):
            ours, theirs = ours[part], theirs[part]
        assert ours == theirs, node


def test_table_14_configs_differ_only_in_the_backbone():
    dumps = {}
    for relative in PAPER_CONFIGS:
        cfg = load_config(relative)
        cfg.MODEL.LAMBDA_RESNET.DEPTH = cfg.MODEL.LAMBDA_RESNET.PLACEMENT = None
        cfg.MODEL.LAMBDA_RESNET.SE = cfg.MODEL.LAMBDA_RESNET.MIXER = None
        cfg.OUTPUT_DIR = ""
        dumps[relative] = cfg.dump()
    assert len(set(dumps.values())) == 1


def test_config_names_resolve():
    found = resolve_config_file("lambda_r152_mask_rcnn.yaml")
    assert found == str(CONFIGS / "COCO-InstanceSegmentation/lambda_r152_mask_rcnn.yaml")
    assert resolve_config_file("lambda_r26_shapes") == str(CONFIGS / "Demo/lambda_r26_shapes.yaml")
    with pytest.raises(
        FileNotFoundError, match="'lambda_r999_mask_rcnn' is neither a file nor a shipped config"
    ):
        resolve_config_file("lambda_r999_mask_rcnn")


def test_cpu_runs_replace_syncbn():
    cfg = load_config("COCO-InstanceSegmentation/lambda_r101_mask_rcnn.yaml")
    cfg.MODEL.DEVICE = "cpu"
    assert sorted(adapt_norms_to_device(cfg)) == ["MODEL.FPN.NORM", "MODEL.LAMBDA_RESNET.NORM"]
    assert cfg.MODEL.LAMBDA_RESNET.NORM == cfg.MODEL.FPN.NORM == "naiveSyncBN"
    assert adapt_norms_to_device(cfg) == []  # nothing left to change
    # The same function on a LazyConfig recipe, whose keys are its own.
    recipe = load_lazy_config("lambda_r101_mask_rcnn")
    recipe.train.device = "cpu"
    assert sorted(adapt_norms_to_device(recipe)) == [
        "model.backbone.bottom_up.norm",
        "model.backbone.norm",
    ]
    assert recipe.model.backbone.bottom_up.norm == "naiveSyncBN"


def test_demo_names_the_config_differences_of_a_finished_run():
    saved = "SEED: 0\nMODEL:\n  DEVICE: cpu\n  WEIGHTS: ''\n"
    assert demo.config_differences(saved, saved) == []
    wanted = "SEED: 1\nMODEL:\n  DEVICE: cpu\n  WEIGHTS: ''\n  NEW: 2\n"
    assert demo.config_differences(saved, wanted) == ["MODEL.NEW: None -> 2", "SEED: 0 -> 1"]


def test_a_key_missing_from_a_saved_config_counts_as_its_default():
    # A run saved before lambda_det added a key is the same run under the newer lambda_det.
    from lambda_det.run_config import config_differences, get_cfg

    wanted = get_cfg()
    wanted.MODEL.LAMBDA_RESNET.DEPTH = 26
    saved = wanted.clone()
    del saved.MODEL.LAMBDA_RESNET["COMPILE"]
    del saved.SOLVER.AMP["DTYPE"]
    assert "COMPILE" not in saved.dump()
    assert config_differences(saved.dump(), wanted.dump()) == []
    wanted.MODEL.LAMBDA_RESNET.COMPILE = True  # not the default: a difference
    assert config_differences(saved.dump(), wanted.dump()) == [
        "MODEL.LAMBDA_RESNET.COMPILE: False -> True"
    ]


@pytest.mark.parametrize("relative", FINE_TUNING_CONFIGS)
def test_fine_tuning_configs_follow_detectron2s_schedules_from_timms_weights(relative):
    cfg = load_config(relative)
    schedule = "3x" if relative.endswith("_3x.yaml") else "1x"
    steps, max_iter = {"1x": ((60000, 80000), 90000), "3x": ((210000, 250000), 270000)}[schedule]
    assert (cfg.SOLVER.IMS_PER_BATCH, cfg.SOLVER.BASE_LR) == (16, 0.02)
    assert (tuple(cfg.SOLVER.STEPS), cfg.SOLVER.MAX_ITER) == (steps, max_iter)
    assert cfg.MODEL.WEIGHTS == f"timm://{cfg.MODEL.TIMM.NAME}"
    assert (cfg.MODEL.TIMM.NORM, cfg.MODEL.BACKBONE.FREEZE_AT, cfg.INPUT.FORMAT) == (
        "FrozenBN",
        2,
        "RGB",
    )
    # timm's ImageNet statistics, on detectron2's 0-255 pixels.
    timm = pytest.importorskip("timm")
    pretrained = timm.models.get_pretrained_cfg(cfg.MODEL.TIMM.NAME)
    assert cfg.MODEL.PIXEL_MEAN == pytest.approx([255 * m for m in pretrained.mean])
    assert cfg.MODEL.PIXEL_STD == pytest.approx([255 * s for s in pretrained.std])
