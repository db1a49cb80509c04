"""Long-job reliability: exact resume, safe checkpoints, multi-process runs, bad input."""
import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import CONFIGS, REPO_ROOT, subprocess_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import lambda_det
import lambda_det.data  # noqa: F401
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import register_coco_instances
from detectron2.engine import HookBase
from detectron2.modeling import build_model
from detectron2.utils.events import EventStorage
from lambda_det.checkpoint import (
    AtomicCheckpointer, CorruptCheckpointError, UnsafeCheckpointError, WeightsMismatchError)
from lambda_det.checkpoint import checkpointer as checkpoint_module
from lambda_det.checkpoint import load_weights
from lambda_det.cli.output_dir import prepare_output_dir
from lambda_det.data.checks import check_dataset_dicts, load_checked_dataset_dicts
from lambda_det.checkpoint import evaluation_weights as _evaluation_weights
from lambda_det.engine import Trainer
from lambda_det.engine.run_settings import yaml_run_settings
from lambda_det.modeling import lambda_resnet

TINY = {"MODEL.DEVICE": "cpu", "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER": 0.25,
        "MODEL.LAMBDA_RESNET.SCOPE": 3, "MODEL.LAMBDA_RESNET.NORM": "BN", "MODEL.FPN.NORM": "BN",
        "MODEL.ROI_BOX_HEAD.NORM": "BN", "MODEL.ROI_MASK_HEAD.NORM": "BN",
        "SOLVER.IMS_PER_BATCH": 2, "SOLVER.WARMUP_ITERS": 2, "SOLVER.STEPS": (3, 5),
        "SOLVER.MAX_ITER": 6, "SOLVER.CHECKPOINT_PERIOD": 3, "DATALOADER.NUM_WORKERS": 0,
        "DATALOADER.DETERMINISTIC": True, "SEED": 7, "DATASETS.TEST": ()}


def tiny_cfg(output_dir: Path, **overrides):
    cfg = lambda_det.get_cfg()
    cfg.merge_from_file(str(CONFIGS / "Demo/lambda_r26_shapes.yaml"))
    pairs = {**TINY, **overrides, "OUTPUT_DIR": str(output_dir)}
    cfg.merge_from_list([item for key, value in pairs.items() for item in (key, str(value))])
    return cfg


class Killed(Exception):
    pass


class RecordLosses(HookBase):
    """Records each iteration's total loss; can kill the job after a given iteration."""

    def __init__(self, kill_after=None):
        self.losses = []
        self.kill_after = kill_after

    def after_step(self):  # runs after the checkpoint hook of the same step
        self.losses.append(self.trainer.storage.history("total_loss").latest())
        if self.trainer.iter + 1 == self.kill_after:
            raise Killed


def train(cfg, *, resume=False, stop_after=None):
    trainer = Trainer(cfg)
    recorder = RecordLosses(kill_after=stop_after)
    trainer.register_hooks([recorder])
    trainer.resume_or_load(resume=resume)
    try:
        trainer.train()
    except Killed:
        pass
    return trainer, recorder.losses


@pytest.mark.slow
def test_resume_is_bit_exact(tmp_path, shapes):
    straight, straight_losses = train(tiny_cfg(tmp_path / "straight"))
    interrupted_dir = tmp_path / "interrupted"
    _, first_losses = train(tiny_cfg(interrupted_dir), stop_after=3)
    assert (interrupted_dir / "last_checkpoint").read_text() == "model_0000002.pth"
    resumed, resumed_losses = train(tiny_cfg(interrupted_dir), resume=True)
    assert resumed.start_iter == 3
    assert first_losses + resumed_losses == straight_losses
    for (name, a), b in zip(straight.model.state_dict().items(),
                            resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    # Without the deterministic loader a resumed run drifts from the straight one: the equality
    # above is the loader's doing, not automatic.
    plain = {"DATALOADER.DETERMINISTIC": False}
    _, plain_straight = train(tiny_cfg(tmp_path / "plain_straight", **plain))
    train(tiny_cfg(tmp_path / "plain", **plain), stop_after=3)
    _, plain_resumed = train(tiny_cfg(tmp_path / "plain", **plain), resume=True)
    assert len(plain_resumed) == 3 and plain_resumed != plain_straight[3:]


def test_deterministic_loader_splits_global_batches_across_processes(shapes):
    cfg = tiny_cfg(Path("unused"), **{"SOLVER.IMS_PER_BATCH": 4})
    single = Trainer.build_train_loader(cfg)
    from lambda_det.engine import DeterministicTrainLoader

    halves = [DeterministicTrainLoader(single.dataset, single.mapper, 4, cfg.SEED, rank, 2)
              for rank in (0, 1)]
    whole = single.batches(5, 1)[0]
    split = halves[0].batches(5, 1)[0] + halves[1].batches(5, 1)[0]
    for a, b in zip(whole, split):
        assert a["file_name"] == b["file_name"] and torch.equal(a["image"], b["image"])


def test_truncated_checkpoint_is_named(tmp_path):
    model = lambda_resnet(26, width_multiplier=0.25, scope=3)
    checkpointer = AtomicCheckpointer(model, save_dir=str(tmp_path))
    checkpointer.save("model_0000009", iteration=9)
    path = tmp_path / "model_0000009.pth"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {path} is truncated or corrupt"):
        AtomicCheckpointer(model, save_dir=str(tmp_path)).resume_or_load("", resume=True)


class NotATensor:
    """A pickled object that torch.load(weights_only=True) refuses."""


def test_checkpoint_with_pickled_objects_is_refused_not_called_corrupt(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)
    model = lambda_resnet(26, width_multiplier=0.25, scope=3)
    path = tmp_path / "pickled.pth"
    torch.save({"model": model.state_dict(), "extra": NotATensor()}, path)
    with pytest.raises(UnsafeCheckpointError, match=f"checkpoint {path} refers to "
                                                    r"test_reliability.NotATensor, which "
                                                    r"torch.load\(weights_only=True\) refuses"):
        AtomicCheckpointer(model).load(str(path))


def test_killed_mid_write_keeps_last_checkpoint_valid(tmp_path, monkeypatch):
    model = lambda_resnet(26, width_multiplier=0.25, scope=3)
    checkpointer = AtomicCheckpointer(model, save_dir=str(tmp_path))
    checkpointer.save("model_0000004", iteration=4)

    def killed(data, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # the job dies mid-write

    monkeypatch.setattr(checkpoint_module.torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpointer.save("model_0000009", iteration=9)
    monkeypatch.undo()
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000004.pth"
    assert not (tmp_path / "model_0000009.pth").exists()
    assert not list(tmp_path.glob("*.tmp"))  # no full-size leftovers
    loaded = AtomicCheckpointer(model, save_dir=str(tmp_path)).resume_or_load("", resume=True)
    assert loaded["iteration"] == 4


def test_nan_loss_stops_training_naming_iteration_and_losses(tmp_path, shapes):
    cfg = tiny_cfg(tmp_path / "nan")
    trainer = Trainer(cfg)
    model = trainer.model
    original = model.forward

    def poisoned(batched_inputs):
        losses = original(batched_inputs)
        if trainer.iter == 2:
            losses["loss_mask"] = losses["loss_mask"] * float("nan")
        return losses

    model.forward = poisoned
    with pytest.raises(FloatingPointError, match=r"(?s)iteration=2.*loss_mask"):
        trainer.train()


def write_coco(folder: Path, images, annotations) -> Path:
    path = folder / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": [{"id": 1, "name": "thing"}]}))
    return path


def register(name: str, json_path: Path, image_root: Path):
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    register_coco_instances(name, {}, str(json_path), str(image_root))


def square(x, y, size):
    return [[x, y, x + size, y, x + size, y + size, x, y + size]]


@pytest.mark.parametrize("problem,error,message", [
    ("negative box", ValueError, r"a\.png\), annotation 1 of 1 has a box of negative size, "
                                 r"bbox=\[5, 5, -3, 4\]"),
    ("infinite box", ValueError, r"a\.png\), annotation 1 of 1 has bbox=\[5, 5, inf, 4\], not 4 "
                                 r"finite numbers"),
    ("missing bbox", ValueError, r"image id 1 \(.*a\.png\), annotation 1 of 1 has no 'bbox'"),
    ("missing image", FileNotFoundError, r"image file .*missing\.png does not exist"),
    ("missing segmentation", ValueError, r"a\.png\), annotation 1 of 1 has no 'segmentation'"),
])
def test_bad_coco_annotations_are_named(tmp_path, problem, error, message):
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((20, 20, 3), np.uint8))
    annotation = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 5, 6, 4], "area": 24,
                  "iscrowd": 0, "segmentation": square(5, 5, 4)}
    image = {"id": 1, "file_name": "a.png", "height": 20, "width": 20}
    if problem == "negative box":
        annotation["bbox"] = [5, 5, -3, 4]
    elif problem == "infinite box":
        annotation["bbox"] = [5, 5, float("inf"), 4]
    elif problem == "missing bbox":
        del annotation["bbox"]
    elif problem == "missing image":
        image["file_name"] = "missing.png"
    elif problem == "missing segmentation":
        del annotation["segmentation"]
    register("lambda_det_test_bad_coco", write_coco(tmp_path, [image], [annotation]), tmp_path)
    with pytest.raises(error, match=message):
        load_checked_dataset_dicts(["lambda_det_test_bad_coco"], require_masks=True)


def test_numpy_boxes_pass_the_checks(tmp_path):
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((20, 20, 3), np.uint8))
    boxes = [np.array([1, 1, 3, 3], np.float32), [np.int64(1), 1, 3, 3]]
    check_dataset_dicts([{"file_name": str(tmp_path / "a.png"), "annotations": [
        {"bbox": box, "category_id": 0} for box in boxes]}])


def test_unregistered_dataset_is_named_with_close_matches():
    with pytest.raises(KeyError, match="dataset 'coco_2017_trian' is not registered; did you mean "
                                       "'coco_2017_train'"):
        load_checked_dataset_dicts(["coco_2017_trian"])


def test_missing_dataset_folder_says_how_to_set_detectron2_datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("DETECTRON2_DATASETS", str(tmp_path / "nowhere"))
    register("lambda_det_test_missing", tmp_path / "nowhere/coco/instances.json",
             tmp_path / "nowhere/coco")
    with pytest.raises(FileNotFoundError, match="set DETECTRON2_DATASETS to the folder that holds"):
        load_checked_dataset_dicts(["lambda_det_test_missing"])


def test_unusual_images_train_and_infer(tmp_path):
    """Grayscale, RGBA, 1x1 and 17x31 images, and an image without annotations."""
    images, annotations = [], []
    for image_id, (name, array) in enumerate([
            ("gray.png", np.full((40, 50), 90, np.uint8)),
            ("rgba.png", np.full((30, 40, 4), 200, np.uint8)),
            ("one.png", np.full((1, 1, 3), 10, np.uint8)),
            ("odd.png", np.full((17, 31, 3), 60, np.uint8)),
            ("empty.png", np.full((24, 24, 3), 30, np.uint8))], start=1):
        cv2.imwrite(str(tmp_path / name), array)
        height, width = array.shape[:2]
        images.append({"id": image_id, "file_name": name, "height": height, "width": width})
        size = 1 if name == "one.png" else 8
        if name != "empty.png":
            annotations.append({"id": image_id, "image_id": image_id, "category_id": 1,
                                "bbox": [0, 0, size, size], "area": size * size, "iscrowd": 0,
                                "segmentation": square(0, 0, size)})
    register("lambda_det_test_unusual", write_coco(tmp_path, images, annotations), tmp_path)
    cfg = tiny_cfg(tmp_path / "out", **{"DATASETS.TRAIN": ("lambda_det_test_unusual",),
                                        "MODEL.ROI_HEADS.NUM_CLASSES": 1,
                                        "SOLVER.IMS_PER_BATCH": 4})
    loader = Trainer.build_train_loader(cfg)
    # The image without annotations is dropped (detectron2's FILTER_EMPTY_ANNOTATIONS, logged).
    assert sorted(Path(r["file_name"]).name for r in loader.dataset) == [
        "gray.png", "odd.png", "one.png", "rgba.png"]
    batch = next(iter(loader))
    assert len(batch) == 4 and all(record["image"].shape == (3, 256, 256) for record in batch)
    model = build_model(cfg)
    with EventStorage():
        losses = model(batch)
    assert all(torch.isfinite(value) for value in losses.values())
    model.eval()
    with torch.no_grad():
        outputs = model([{"image": torch.zeros(3, 1, 1, dtype=torch.uint8), "height": 1,
                          "width": 1},
                         {"image": torch.zeros(3, 17, 31, dtype=torch.uint8)}])
    assert outputs[0]["instances"].image_size == (1, 1)


@pytest.mark.parametrize("override,message", [
    (("MODEL.LAMBDA_RESNET.DEPTH", 77), "depth must be one of .* got 77"),
    (("MODEL.LAMBDA_RESNET.PLACEMENT", "LLXL"), "got 'LLXL'"),
    (("MODEL.LAMBDA_RESNET.SCOPE", 4), "scope must be an odd integer >= 1.*got 4"),
    (("MODEL.LAMBDA_RESNET.HEADS", 3), "not divisible by heads=3"),
    (("MODEL.LAMBDA_RESNET.HEADS", 0), "heads must be an integer >= 1, got 0"),
    (("MODEL.LAMBDA_RESNET.NORM", "BNN"), "norm must be a detectron2 norm .* got 'BNN'"),
    (("MODEL.LAMBDA_RESNET.OUT_FEATURES", ["res3", "res4", "res5"]),
     r"MODEL.FPN.IN_FEATURES \['res2', 'res3', 'res4', 'res5'\] needs \['res2'\], which "
     r"MODEL.LAMBDA_RESNET.OUT_FEATURES \['res3', 'res4', 'res5'\] does not output"),
])
def test_bad_configs_are_named(tmp_path, override, message):
    cfg = tiny_cfg(tmp_path, **{override[0]: override[1]})
    with pytest.raises(ValueError, match=message):
        build_model(cfg)


def test_bad_log_period_is_named(tmp_path, shapes):
    with pytest.raises(ValueError, match="SOLVER.LOG_PERIOD must be an integer >= 1 .*got 0"):
        Trainer(tiny_cfg(tmp_path, **{"SOLVER.LOG_PERIOD": 0}))


def test_training_over_a_run_needs_resume_or_restart(tmp_path):
    run = {"last_checkpoint": "model_0000009.pth", "model_0000009.pth": "weights",
           "metrics.json": "{}", "eval_results.json": "{}", "log.txt": "log"}
    for name, text in run.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "notes.md").write_text("not the run's")  # e.g. OUTPUT_DIR "." in a checkout
    with pytest.raises(FileExistsError, match=r"already holds a run \(last checkpoint "
                                              r"model_0000009.pth\): pass --resume .* --restart"):
        prepare_output_dir(str(tmp_path), resume=False, restart=False)
    assert prepare_output_dir(str(tmp_path), resume=True, restart=False) is None  # continues
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*run, "notes.md"])
    # Another machine of a multi-machine job leaves the moving to machine 0.
    assert prepare_output_dir(str(tmp_path), resume=False, restart=True, machine_rank=1) is None
    previous = Path(prepare_output_dir(str(tmp_path), resume=False, restart=True))
    assert previous.parent == tmp_path and previous.name.startswith("previous_")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.md", previous.name]
    assert {name: (previous / name).read_text() for name in run} == run  # nothing lost
    assert prepare_output_dir(str(tmp_path), resume=False, restart=False) is None


def evaluation_weights(cfg, resume: bool) -> str:
    settings = yaml_run_settings(cfg)
    return _evaluation_weights(settings.output_dir, settings.training.weights, resume)


def test_evaluation_loads_every_weight_or_refuses(tmp_path):
    cfg = tiny_cfg(tmp_path)
    trained = build_model(cfg)
    with pytest.raises(ValueError, match="MODEL.WEIGHTS is empty"):
        evaluation_weights(cfg, resume=False)
    with pytest.raises(ValueError, match="MODEL.WEIGHTS is empty and OUTPUT_DIR .* has no "
                                         "last_checkpoint"):
        evaluation_weights(cfg, resume=True)
    AtomicCheckpointer(trained, save_dir=str(tmp_path)).save("model_0000004")
    evaluated = build_model(cfg)
    weights = evaluation_weights(cfg, resume=True)
    assert weights.endswith("model_0000004.pth")
    load_weights(evaluated, weights)
    for loaded, saved in zip(evaluated.state_dict().values(), trained.state_dict().values()):
        assert torch.equal(loaded, saved)
    # A checkpoint without the backbone would give detectron2 a half-random model to evaluate.
    state = {key: value for key, value in trained.state_dict().items()
             if not key.startswith("backbone.")}
    torch.save({"model": state}, tmp_path / "heads_only.pth")
    cfg.MODEL.WEIGHTS = str(tmp_path / "heads_only.pth")
    with pytest.raises(WeightsMismatchError, match="does not fit the model .* missing weights"):
        load_weights(build_model(cfg), evaluation_weights(cfg, resume=False))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(depth=st.sampled_from([26, 50]),
       placement=st.text(alphabet="CL", min_size=4, max_size=4),
       scope=st.sampled_from([1, 3, 5, 7]),
       heads=st.sampled_from([1, 2, 4]),
       dim_k=st.integers(1, 8),
       dim_u=st.integers(1, 3),
       impl=st.sampled_from(["auto", "einsum", "conv"]),
       height=st.integers(17, 72), width=st.integers(17, 72))
def test_random_valid_configurations_train(depth, placement, scope, heads, dim_k, dim_u, impl,
                                           height, width):
    model = lambda_resnet(depth, placement=placement, width_multiplier=0.125, scope=scope,
                          heads=heads, dim_k=dim_k, dim_u=dim_u, impl=impl)
    outputs = model(torch.randn(2, 3, height, width))
    loss = sum(output.float().mean() for output in outputs.values())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def run_train_net(*args: str, datasets_root: Path, timeout: int = 900):
    env = subprocess_env()
    env["DETECTRON2_DATASETS"] = str(datasets_root)
    return subprocess.run([sys.executable, str(REPO_ROOT / "tools/train_net.py"), *args],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=timeout)


def logged_losses(output: Path):
    lines = [json.loads(line) for line in (output / "metrics.json").read_text().splitlines()]
    return [line["total_loss"] for line in lines if "total_loss" in line]


@pytest.mark.slow
def test_two_cpu_processes_follow_the_one_process_trajectory(tmp_path, datasets_root):
    overrides = []
    for key, value in {**TINY, "SOLVER.IMS_PER_BATCH": 4, "SOLVER.LOG_PERIOD": 1,
                       "MODEL.LAMBDA_RESNET.NORM": "naiveSyncBN", "MODEL.FPN.NORM": "naiveSyncBN",
                       "MODEL.ROI_BOX_HEAD.NORM": "naiveSyncBN_N",
                       "MODEL.ROI_MASK_HEAD.NORM": "naiveSyncBN_N"}.items():
        overrides += [key, str(value)]
    runs = {}
    for processes in (1, 2):
        output = tmp_path / f"p{processes}"
        # "auto": a free port, so that a test running beside it (pytest-xdist) cannot collide.
        result = run_train_net("--config", "lambda_r26_shapes", "--num-gpus", str(processes),
                               "--dist-url", "auto", *overrides, "OUTPUT_DIR", str(output),
                               datasets_root=datasets_root)
        assert result.returncode == 0, result.stderr[-3000:]
        # No deprecation warnings a user can do nothing about (DDP broadcast_buffers, ...).
        assert "FutureWarning" not in result.stderr and "deprecated" not in result.stderr
        runs[processes] = np.array(logged_losses(output))
    assert len(runs[1]) == len(runs[2]) == TINY["SOLVER.MAX_ITER"]
    # Same images and augmentations per iteration; the processes differ in ROI sampling and in
    # per-process loss normalisation, so the trajectories agree closely but not bit for bit.
    np.testing.assert_allclose(runs[2], runs[1], rtol=0.05)
