"""The paper's pipeline: configs, LSJ, the bundled dataset, train_net.py end to end (AP tables:
evaluation/test_ap_tables.py)."""
import json
import math
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import lambda_det.data  # noqa: F401
import lambda_det.modeling  # noqa: F401  (registers the backbones)
from conftest import CONFIGS, REPO_ROOT, load_tool, subprocess_env
from detectron2.data import transforms as T
from detectron2.engine import DefaultTrainer
from detectron2.modeling import build_model
from lambda_det.data import build_lsj_augmentations, build_mapper
from lambda_det.data.shapes import SHAPES_CLASSES, generate_split
from lambda_det.config import adapt_norms_to_device, resolve_config_file
from lambda_det.config.lazy import load_lazy_config
from lambda_det.evaluation import load_results

SHIPPED_CONFIGS = sorted(str(p.relative_to(CONFIGS)) for p in CONFIGS.rglob("*.yaml"))
PAPER_CONFIGS = [name for name in SHIPPED_CONFIGS if name.startswith("COCO-InstanceSegmentation")]


def load_config(relative: str):
    cfg = lambda_det.get_cfg()
    cfg.merge_from_file(str(CONFIGS / relative))
    return cfg


def test_every_table_14_config_is_shipped():
    names = {Path(p).stem for p in PAPER_CONFIGS}
    assert {"lambda_r101_mask_rcnn", "lambda_r152_mask_rcnn", "r101_mask_rcnn", "r101_se_mask_rcnn",
            "r152_mask_rcnn", "r152_se_mask_rcnn"} <= names


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
        outputs = model([{"image": torch.randint(0, 255, (3, 64, 96), dtype=torch.uint8),
                          "height": 64, "width": 96}])
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


@pytest.mark.parametrize("relative", [name for name in SHIPPED_CONFIGS
                                      if name.startswith("COCO-Detection")])
def test_detection_configs_follow_the_paper_schedule(relative):
    cfg = load_config(relative)
    paper = load_config("COCO-InstanceSegmentation/lambda_r101_mask_rcnn.yaml")
    for node in ("SOLVER", "INPUT.LSJ", "INPUT.MIN_SIZE_TEST", "INPUT.MAX_SIZE_TEST",
                 "MODEL.WEIGHTS", "MODEL.BACKBONE.FREEZE_AT", "MODEL.LAMBDA_RESNET.NORM",
                 "MODEL.LAMBDA_RESNET.DEPTH", "MODEL.LAMBDA_RESNET.PLACEMENT", "MODEL.FPN.NORM"):
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
    with pytest.raises(FileNotFoundError, match="'lambda_r999_mask_rcnn' is neither a file nor a shipped config"):
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
    assert sorted(adapt_norms_to_device(recipe)) == ["model.backbone.bottom_up.norm",
                                                     "model.backbone.norm"]
    assert recipe.model.backbone.bottom_up.norm == "naiveSyncBN"


def test_lsj_crops_pads_and_recomputes_boxes(tmp_path):
    cfg = load_config("Demo/lambda_r26_shapes.yaml")
    cfg.INPUT.LSJ.IMAGE_SIZE = 64
    mapper = build_mapper(cfg, is_train=True)
    image = np.random.randint(0, 255, (50, 80, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "image.png"), image)
    polygon = [[10.0, 10.0, 40.0, 10.0, 40.0, 30.0, 10.0, 30.0]]
    record = {"file_name": str(tmp_path / "image.png"), "height": 50, "width": 80, "annotations": [
        {"bbox": [10, 10, 30, 20], "bbox_mode": 0, "category_id": 1, "segmentation": polygon}]}
    sizes = set()
    for seed in range(6):
        np.random.seed(seed)
        out = mapper(dict(record, annotations=[dict(record["annotations"][0])]))
        assert tuple(out["image"].shape) == (3, 64, 64)
        instances = out["instances"]
        if len(instances):
            mask_box = instances.gt_masks.get_bounding_boxes().tensor
            assert torch.allclose(instances.gt_boxes.tensor, mask_box)
        sizes.add(int((out["image"] != 128).any(0).sum()))
    assert len(sizes) > 1  # different scales each time
    # Evaluation keeps detectron2's test resize, whatever LSJ.IMAGE_SIZE is.
    (test_resize,) = build_mapper(cfg, is_train=False).augmentations.augs
    assert isinstance(test_resize, T.ResizeShortestEdge)
    resized = test_resize.get_transform(np.zeros((480, 640, 3)))
    assert resized.new_w == cfg.INPUT.MAX_SIZE_TEST == 256
    with pytest.raises(ValueError, match="got 2.0 and 0.1"):
        build_lsj_augmentations(64, 2.0, 0.1)
    with pytest.raises(ValueError, match="LSJ is a training augmentation"):
        build_lsj_augmentations(1024, 0.1, 2.0, is_train=False)


def test_evaluation_at_another_size_than_training_is_logged(caplog):
    cfg = load_config("Demo/lambda_r26_shapes.yaml")
    with caplog.at_level("WARNING", logger="lambda_det.data.mapper"):
        build_mapper(cfg, is_train=False)
    assert not caplog.records  # the demo trains and evaluates at 256
    cfg.INPUT.LSJ.IMAGE_SIZE = 640
    with caplog.at_level("WARNING", logger="lambda_det.data.mapper"):
        build_mapper(cfg, is_train=False)
    assert "not at the training size INPUT.LSJ.IMAGE_SIZE = 640" in caplog.text


def test_shapes_registration_follows_detectron2_datasets_when_registered(tmp_path, monkeypatch):
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from lambda_det.data import register_shapes_datasets

    # A complete (tiny) dataset folder under another DETECTRON2_DATASETS.
    root = tmp_path / "lambda_det_shapes_v1"
    (root / "val").mkdir(parents=True)
    cv2.imwrite(str(root / "val" / "1.png"), np.zeros((8, 8, 3), np.uint8))
    (root / "val.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "1.png", "height": 8, "width": 8}], "annotations": [],
        "categories": [{"id": i + 1, "name": name} for i, name in enumerate(SHAPES_CLASSES)]}))
    (root / "COMPLETE").write_text("v1")
    monkeypatch.setenv("DETECTRON2_DATASETS", str(tmp_path))
    register_shapes_datasets()
    metadata = MetadataCatalog.get("lambda_det_shapes_val")
    assert metadata.json_file == str(root / "val.json")  # what COCOEvaluator reads
    monkeypatch.setenv("DETECTRON2_DATASETS", str(tmp_path / "elsewhere"))  # after registration
    (record,) = DatasetCatalog.get("lambda_det_shapes_val")
    assert record["file_name"] == str(root / "val" / "1.png")  # the same folder
    monkeypatch.undo()
    register_shapes_datasets()
    assert not MetadataCatalog.get("lambda_det_shapes_val").json_file.startswith(str(tmp_path))
    stale = tmp_path / "stale"
    (stale / "leftover").mkdir(parents=True)
    # The refusal comes after the generation (into a staging folder): skip drawing 304 images.
    monkeypatch.setattr(lambda_det.data.shapes, "generate_split", lambda folder, split: folder)
    with pytest.raises(OSError, match=f"cannot create the shapes dataset at {stale}: the folder "
                                      f"exists but is not a complete dataset"):
        lambda_det.data.ensure_shapes_dataset(stale)


@pytest.mark.slow
def test_shapes_dataset_is_deterministic_and_covers_every_size(tmp_path):
    first = json.loads(generate_split(tmp_path / "a", "val").read_text())
    second = json.loads(generate_split(tmp_path / "b", "val").read_text())
    assert first == second
    assert (tmp_path / "a/val/00001.png").read_bytes() == (tmp_path / "b/val/00001.png").read_bytes()
    areas = [a["area"] for a in first["annotations"]]
    buckets = {"small": sum(a < 32 ** 2 for a in areas), "large": sum(a > 96 ** 2 for a in areas)}
    buckets["medium"] = len(areas) - buckets["small"] - buckets["large"]
    assert min(buckets.values()) >= 20, buckets
    assert {c["name"] for c in first["categories"]} == set(SHAPES_CLASSES)
    assert {a["category_id"] for a in first["annotations"]} == {1, 2, 3}


def test_demo_names_the_config_differences_of_a_finished_run():
    demo = load_tool("demo")
    saved = "SEED: 0\nMODEL:\n  DEVICE: cpu\n  WEIGHTS: ''\n"
    assert demo.config_differences(saved, saved) == []
    wanted = "SEED: 1\nMODEL:\n  DEVICE: cpu\n  WEIGHTS: ''\n  NEW: 2\n"
    assert demo.config_differences(saved, wanted) == ["MODEL.NEW: None -> 2", "SEED: 0 -> 1"]


def test_a_key_missing_from_a_saved_config_counts_as_its_default():
    # A run saved before lambda_det added a key is the same run under the newer lambda_det.
    from lambda_det.config import config_differences, get_cfg

    wanted = get_cfg()
    wanted.MODEL.LAMBDA_RESNET.DEPTH = 26
    saved = wanted.clone()
    del saved.MODEL.LAMBDA_RESNET["COMPILE"]
    del saved.SOLVER.AMP["DTYPE"]
    assert "COMPILE" not in saved.dump()
    assert config_differences(saved.dump(), wanted.dump()) == []
    wanted.MODEL.LAMBDA_RESNET.COMPILE = True  # not the default: a difference
    assert config_differences(saved.dump(), wanted.dump()) == [
        "MODEL.LAMBDA_RESNET.COMPILE: False -> True"]


def run_tool(script: str, *args: str, datasets_root: Path, timeout: int = 900):
    env = subprocess_env()
    env["DETECTRON2_DATASETS"] = str(datasets_root)
    return subprocess.run([sys.executable, str(REPO_ROOT / "tools" / script), *args],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=timeout)


TINY_TRAINING = ["MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER", "0.25", "MODEL.LAMBDA_RESNET.SCOPE", "3",
                 "SOLVER.IMS_PER_BATCH", "2", "SOLVER.MAX_ITER", "4", "SOLVER.STEPS", "(2, 3)",
                 "SOLVER.WARMUP_ITERS", "1", "DATALOADER.NUM_WORKERS", "0",
                 "MODEL.RPN.POST_NMS_TOPK_TEST", "50", "TEST.DETECTIONS_PER_IMAGE", "20"]


@pytest.mark.slow
@pytest.mark.e2e
def test_train_net_trains_evaluates_and_reports_ap_by_size(tmp_path, datasets_root):
    output = tmp_path / "run"
    result = run_tool("train_net.py", "--config", "lambda_r26_shapes.yaml", *TINY_TRAINING,
                      "OUTPUT_DIR", str(output), datasets_root=datasets_root)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (output / "model_final.pth").is_file()
    # Piped output and the log file carry no terminal colour codes.
    assert "\x1b[" not in result.stdout + result.stderr
    assert "\x1b[" not in (output / "log.txt").read_text()
    results = load_results(str(output))
    for task in ("bbox", "segm"):
        assert {"AP", "AP50", "AP75", "APs", "APm", "APl"} <= set(results[task])
        assert all(not math.isnan(results[task][m]) for m in ("APs", "APm", "APl"))
    report = run_tool("ap_table.py", f"tiny={output}", "--plot", str(tmp_path / "ap.png"),
                      datasets_root=datasets_root)
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith("| Backbone | AP bb | APs/m/l bb | AP mask | APs/m/l mask |")
    assert "| tiny |" in report.stdout and (tmp_path / "ap.png").is_file()
    # --eval-only on the trained weights reproduces the same numbers.
    again = run_tool("train_net.py", "--config", "lambda_r26_shapes", "--eval-only", *TINY_TRAINING,
                     "MODEL.WEIGHTS", str(output / "model_final.pth"),
                     "OUTPUT_DIR", str(tmp_path / "eval"), datasets_root=datasets_root)
    assert again.returncode == 0, again.stderr[-3000:]
    assert load_results(str(tmp_path / "eval")) == results
    # Neither a second training nor an evaluation without weights replaces the finished run.
    retrain = run_tool("train_net.py", "--config", "lambda_r26_shapes", *TINY_TRAINING,
                       "OUTPUT_DIR", str(output), datasets_root=datasets_root)
    assert retrain.returncode != 0 and "already holds a run" in retrain.stderr
    unweighted = run_tool("train_net.py", "--config", "lambda_r26_shapes", "--eval-only",
                          *TINY_TRAINING, "OUTPUT_DIR", str(output), datasets_root=datasets_root)
    assert unweighted.returncode != 0 and "MODEL.WEIGHTS is empty" in unweighted.stderr
    assert load_results(str(output)) == results
