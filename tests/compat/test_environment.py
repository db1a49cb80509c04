"""The environment works: detectron2 on today's stack, with and without lambda_det imported."""

import inspect
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from lambda_det.compat import import_detectron2

import_detectron2()  # quietly, before the detectron2 imports below

from conftest import (
    CONFIGS,
    REPO_ROOT,
    load_tool,
    run_python,
    subprocess_env,
    tiny_detection_batch,
)
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import register_coco_instances
from detectron2.evaluation import COCOEvaluator
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances
from detectron2.utils.events import EventStorage

build_detectron2 = load_tool("build_detectron2")  # a stdlib-only script


@pytest.mark.slow
def test_detectron2_imports_without_lambda_det():
    result = run_python(
        "-c",
        "import sys\n"
        "import detectron2.modeling, detectron2.engine, detectron2.evaluation, detectron2.data\n"
        "assert not any(m.startswith('lambda_det') for m in sys.modules), 'lambda_det imported'\n"
        "print('ok')",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.slow
def test_import_lambda_det_registers_the_backbones_and_prints_nothing():
    """As detectron2 plugins are used: ``import lambda_det`` registers the backbones, quietly
    (without detectron2's deprecation warnings); the layers alone need no detectron2
    (tests/test_imports.py)."""
    result = run_python(
        "-c",
        "import sys\n"
        "import lambda_det\n"
        "from detectron2.modeling import BACKBONE_REGISTRY\n"
        "assert 'build_lambda_resnet_fpn_backbone' in BACKBONE_REGISTRY, 'not registered'\n"
        "lambda_det.get_cfg()\n",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""


@pytest.mark.slow
@pytest.mark.parametrize("module", ["lambda_det.modeling", "lambda_det.data", "lambda_det.engine"])
def test_importing_the_detectron2_parts_prints_nothing(module):
    result = run_python("-c", f"import {module}\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""


def test_missing_compiled_op_says_why():
    import detectron2._C as compiled

    if getattr(compiled, "HAS_COMPILED_OPS", True):
        pytest.skip("this detectron2 has its compiled ops")
    from detectron2.layers import ROIAlignRotated, nms_rotated
    from detectron2.layers.rotated_boxes import pairwise_iou_rotated

    boxes = torch.tensor([[5.0, 5.0, 4.0, 4.0, 0.0]])
    with pytest.raises(RuntimeError, match="nms_rotated is a compiled op"):
        nms_rotated(boxes, torch.ones(1), 0.5)
    with pytest.raises(RuntimeError, match="box_iou_rotated is a compiled op"):
        pairwise_iou_rotated(boxes, boxes)
    rois = torch.tensor([[0.0, 5.0, 5.0, 4.0, 4.0, 0.0]])
    with pytest.raises(RuntimeError, match="roi_align_rotated_forward is a compiled op.*C\\+\\+"):
        ROIAlignRotated((2, 2), 1.0, 0)(torch.ones(1, 1, 8, 8), rois)


@pytest.mark.e2e
def test_build_script_leaves_an_existing_detectron2_alone(tmp_path):
    fake = tmp_path / "site" / "detectron2"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '0.9'\n")
    env = subprocess_env()
    env["PYTHONPATH"] = str(tmp_path / "site")
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "build_detectron2.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"already importable from {fake}" in result.stdout
    assert "pip" not in result.stdout


def _fake_detectron2_source(root: Path) -> None:
    """The lines of detectron2 0.6 that the build patches, in a miniature source tree."""
    for relative, old, _ in build_detectron2.SOURCE_PATCHES:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(old + "\n")
    (root / "detectron2/data/build.py").write_text(
        "h = np.zeros((3,), dtype=np.int)\nx = np.int64(1)\ny = np.float32\nb = np.bool_\n"
    )


def test_patch_source_rewrites_exactly_what_it_should(tmp_path):
    _fake_detectron2_source(tmp_path)
    edits = build_detectron2.patch_source(tmp_path)
    assert edits["detectron2/data/build.py"] == 1
    build = (tmp_path / "detectron2/data/build.py").read_text()
    assert build.startswith("h = np.zeros((3,), dtype=int)\n")
    assert "np.int64(1)" in build and "np.float32" in build and "np.bool_" in build
    setup = (tmp_path / "setup.py").read_text()
    assert "ext_modules=[]" in setup and "black" not in setup
    assert "HAS_COMPILED_OPS = False" in (tmp_path / "detectron2/_C.py").read_text()


def test_patch_source_refuses_an_unexpected_tree(tmp_path):
    _fake_detectron2_source(tmp_path)
    (tmp_path / "detectron2/model_zoo/model_zoo.py").write_text("# something else\n")
    with pytest.raises(SystemExit, match="model_zoo.py"):
        build_detectron2.patch_source(tmp_path)


def test_anchor_grid_does_not_warn():
    """The meshgrid patch: without it torch warns on every training run."""
    if (
        build_detectron2.installed_build_id(build_detectron2.detectron2_location())
        != build_detectron2.build_id()
    ):
        pytest.skip("not lambda_det's current build of detectron2")
    from detectron2.modeling.anchor_generator import _create_grid_offsets

    # torch warns once per process, so an earlier test may have used up the warning: check the
    # source as well as the call.
    assert 'indexing="ij"' in inspect.getsource(_create_grid_offsets)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shift_x, shift_y = _create_grid_offsets((2, 3), 8, 0.0, torch.device("cpu"))
    assert shift_x.tolist() == [0, 8, 16, 0, 8, 16] and shift_y.tolist() == [0, 0, 0, 8, 8, 8]


def small_mask_rcnn_cfg():
    cfg = get_cfg()
    cfg.merge_from_file(str(CONFIGS / "Base-RCNN-FPN.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.MASK_ON = True
    cfg.MODEL.WEIGHTS = ""
    cfg.MODEL.BACKBONE.FREEZE_AT = 0  # from scratch, as in the paper
    cfg.MODEL.RESNETS.DEPTH = 18
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = 3
    cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 32
    cfg.MODEL.RPN.BATCH_SIZE_PER_IMAGE = 32
    return cfg


@pytest.mark.slow
def test_mask_rcnn_trains_and_infers_on_cpu():
    model = build_model(small_mask_rcnn_cfg())
    model.train()
    with EventStorage():
        losses = model(tiny_detection_batch(((64, 96), (80, 64))))
    assert {"loss_cls", "loss_box_reg", "loss_mask", "loss_rpn_cls", "loss_rpn_loc"} <= set(losses)
    total = sum(losses.values())
    assert torch.isfinite(total)
    total.backward()
    stem_grad = model.backbone.bottom_up.stem.conv1.weight.grad
    assert stem_grad is not None and stem_grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        outputs = model(tiny_detection_batch(((64, 96), (80, 64))))
    assert len(outputs) == 2 and outputs[0]["instances"].image_size == (64, 96)


def test_checkpoint_round_trip_under_default_torch_load(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)
    cfg = small_mask_rcnn_cfg()
    model = build_model(cfg)
    DetectionCheckpointer(model, save_dir=str(tmp_path)).save("model_final", iteration=7)
    path = tmp_path / "model_final.pth"
    # torch's own default (weights_only=True on torch >= 2.6) must be able to read it.
    assert torch.load(path)["iteration"] == 7
    torch.manual_seed(1)
    restored = build_model(cfg)
    extra = DetectionCheckpointer(restored).load(str(path))
    assert extra["iteration"] == 7
    for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values()):
        assert torch.equal(a, b), name


def _square_polygon(x, y, size):
    return [[x, y, x + size, y, x + size, y + size, x, y + size]]


def write_tiny_coco(folder: Path) -> Path:
    """Three images with one small (16px), one medium (48px) and one large (120px) square."""
    images, annotations = [], []
    for image_id, (size, label) in enumerate(((16, 1), (48, 2), (120, 1)), start=1):
        images.append({"id": image_id, "file_name": f"{image_id}.jpg", "height": 160, "width": 160})
        annotations.append(
            {
                "id": image_id,
                "image_id": image_id,
                "category_id": label,
                "bbox": [10, 10, size, size],
                "area": size * size,
                "iscrowd": 0,
                "segmentation": _square_polygon(10, 10, size),
            }
        )
    coco = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": 1, "name": "square"}, {"id": 2, "name": "other"}],
    }
    path = folder / "instances.json"
    path.write_text(json.dumps(coco))
    return path


def prediction_for(record: dict) -> Instances:
    """A perfect prediction: the ground-truth box and mask of the record's single object."""
    annotation = record["annotations"][0]
    x, y, w, h = annotation["bbox"]  # loaded as XYWH_ABS
    instances = Instances((record["height"], record["width"]))
    instances.pred_boxes = Boxes(torch.tensor([[x, y, x + w, y + h]], dtype=torch.float32))
    instances.scores = torch.tensor([0.9])
    instances.pred_classes = torch.tensor([annotation["category_id"]])
    masks = torch.zeros(1, record["height"], record["width"], dtype=torch.bool)
    masks[0, int(y) : int(y + h), int(x) : int(x + w)] = True
    instances.pred_masks = masks
    return instances


@pytest.mark.parametrize("drop_small", [False, True])
def test_coco_evaluator_reports_ap_by_size(tmp_path, drop_small):
    name = f"lambda_det_test_tiny_coco_{drop_small}"
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    register_coco_instances(name, {}, str(write_tiny_coco(tmp_path)), str(tmp_path))
    evaluator = COCOEvaluator(name, output_dir=str(tmp_path / "eval"))
    evaluator.reset()
    for record in DatasetCatalog.get(name):
        instances = prediction_for(record)
        if drop_small and record["annotations"][0]["bbox"][2] < 32:
            instances = instances[[]]
        evaluator.process([{"image_id": record["image_id"]}], [{"instances": instances}])
    results = evaluator.evaluate()
    for task in ("bbox", "segm"):
        metrics = results[task]
        assert set(metrics) >= {"AP", "AP50", "AP75", "APs", "APm", "APl"}
        assert metrics["APm"] == pytest.approx(100.0)
        assert metrics["APl"] == pytest.approx(100.0)
        assert metrics["APs"] == pytest.approx(0.0 if drop_small else 100.0)
    assert np.isfinite(results["bbox"]["AP"])


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [False, True])
def test_no_cuda_home_warning_where_detectron2_reports_the_environment(tmp_path, quiet):
    """torch warns once, at its first import of cpp_extension, on a machine with a CUDA toolkit
    (here: CUDA_HOME) but no GPU; the run's setup hides it. quiet=False: the negative control."""
    code = (
        "from lambda_det.compat import without_cuda_home_warning\n"
        "from detectron2.utils.collect_env import collect_env_info\n"
        + ("with without_cuda_home_warning():\n    " if quiet else "")
        + "collect_env_info()\n"
    )
    env = subprocess_env()
    env["CUDA_HOME"] = str(tmp_path)
    env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("No CUDA runtime is found" in result.stderr) != quiet, result.stderr[-2000:]
