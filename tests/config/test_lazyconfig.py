"""The LazyConfig recipes (configs/LazyConfigs/) against their yaml twins, and
tools/lazyconfig_train_net.py."""

import contextlib
import copy
import inspect
import json
import os
import re
import types
from pathlib import Path

import pytest
import torch
import yaml
from conftest import CONFIGS, REPO_ROOT, run_tool
from detectron2.config import LazyConfig, instantiate
from detectron2.engine import DefaultTrainer
from detectron2.layers import ShapeSpec
from detectron2.modeling import build_model
from detectron2.modeling.anchor_generator import DefaultAnchorGenerator
from detectron2.solver import build_lr_scheduler, build_optimizer
from detectron2.utils.registry import locate
from omegaconf import OmegaConf
from torch import nn

import lambda_det.data
from lambda_det import model_zoo
from lambda_det.cli.lazyconfig_train_net import main as lazyconfig_main
from lambda_det.config import ConfigFileError
from lambda_det.config.lazy import (
    TRUSTED_FUNCTIONS,
    UntrustedConfigError,
    check_lazy_targets,
    load_lazy_config,
    load_lazy_config_file,
    scale_to_world_size,
)
from lambda_det.data import build_mapper
from lambda_det.data.shapes import register_shapes_datasets
from lambda_det.engine import lazy_training
from lambda_det.run_config import load_config

lambda_det.data.register_datasets()  # the bundled datasets, by name: importing registers none

LAZY_ROOT = CONFIGS / "LazyConfigs"
RECIPES = sorted(
    str(path.relative_to(LAZY_ROOT))
    for path in LAZY_ROOT.rglob("*.py")
    if path.parent.name != "common"
)
TABLE_14 = [
    f"COCO-InstanceSegmentation/{name}_mask_rcnn.py"
    for name in ("lambda_r101", "lambda_r152", "r101", "r101_se", "r152", "r152_se")
]
TORCH_INTERNALS = set(vars(nn.Module()))


def yaml_twin(recipe: str) -> str:
    return str(CONFIGS / recipe.replace(".py", ".yaml"))


def load_pair(recipe: str, yaml_opts=(), lazy_overrides=()):
    """The yaml config (MODEL.DEVICE meta after its norms were set for its own device) and the
    LazyConfig of one recipe."""
    yaml_cfg = load_config(yaml_twin(recipe), yaml_opts, freeze=False)
    yaml_cfg.MODEL.DEVICE = "meta"
    return yaml_cfg, load_lazy_config(str(LAZY_ROOT / recipe), lazy_overrides)


def build_pair(yaml_cfg, lazy_cfg):
    with torch.device("meta"):
        return build_model(yaml_cfg), instantiate(lazy_cfg.model)


def plain(value, depth: int = 0):
    """A comparable form of an attribute value: numbers, strings, tuples, dicts; plain objects
    (Matcher, Box2BoxTransform, ...) by type and attributes; modules and tensors are left to
    the module walk and the shapes."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (nn.Module, torch.Tensor)) or depth > 4:
        return "<skipped>"
    if isinstance(value, dict) or hasattr(value, "items") and hasattr(value, "keys"):
        return {str(key): plain(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return tuple(plain(item, depth + 1) for item in value)
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return value.__qualname__
    if hasattr(value, "__dict__"):
        return (type(value).__name__, plain(vars(value), depth + 1))
    return repr(value)


def describe(model: nn.Module) -> dict:
    """Every submodule's type and attributes, and every parameter's and buffer's shape."""
    description = {}
    for name, module in model.named_modules():
        description[f"{name}:type"] = type(module).__name__
        for key, value in vars(module).items():
            if key not in TORCH_INTERNALS:
                description[f"{name}.{key}"] = plain(value)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        description[f"{name}:shape"] = tuple(tensor.shape)
    return description


def differences(first: dict, second: dict) -> list:
    return [
        f"{key}: {first.get(key, '<absent>')!r} vs {second.get(key, '<absent>')!r}"
        for key in sorted(set(first) | set(second))
        if first.get(key) != second.get(key)
    ]


def test_every_table_14_recipe_and_the_demo_have_a_yaml_twin():
    assert set(TABLE_14) | {"Demo/lambda_r26_shapes.py"} <= set(RECIPES)
    for recipe in RECIPES:
        assert Path(yaml_twin(recipe)).is_file(), recipe
    assert model_zoo.get_config_file("lambda_r152_mask_rcnn.py") == str(LAZY_ROOT / TABLE_14[1])
    assert model_zoo.get_config("lambda_r152_mask_rcnn.py").model.backbone.bottom_up.depth == 152


@pytest.mark.parametrize("recipe", RECIPES)
def test_same_model(recipe):
    yaml_cfg, lazy_cfg = load_pair(recipe)
    yaml_model, lazy_model = build_pair(yaml_cfg, lazy_cfg)
    found = differences(describe(yaml_model), describe(lazy_model))
    assert not found, f"{len(found)} differences (yaml vs lazy), e.g. {found[:10]}"
    assert dict(yaml_model.state_dict()).keys() == dict(lazy_model.state_dict()).keys()
    # Not in the modules on the meta device: pixel statistics, input format and anchors.
    model = lazy_cfg.model
    assert list(model.pixel_mean) == list(yaml_cfg.MODEL.PIXEL_MEAN)
    assert list(model.pixel_std) == list(yaml_cfg.MODEL.PIXEL_STD)
    assert model.input_format == yaml_cfg.INPUT.FORMAT
    strides = [ShapeSpec(stride=stride) for stride in (4, 8, 16, 32, 64)]
    yaml_anchors = DefaultAnchorGenerator(yaml_cfg, strides).cell_anchors
    lazy_anchors = instantiate(model.proposal_generator.anchor_generator).cell_anchors
    assert len(yaml_anchors) == len(lazy_anchors) == 5
    for yaml_cell, lazy_cell in zip(yaml_anchors, lazy_anchors):
        assert torch.equal(yaml_cell, lazy_cell)


@pytest.mark.slow
def test_the_model_comparison_sees_a_changed_value():
    recipe = "Demo/lambda_r26_shapes.py"
    yaml_model, lazy_model = build_pair(*load_pair(recipe))
    assert not differences(describe(yaml_model), describe(lazy_model))
    for override in (
        "model.roi_heads.box_predictor.test_nms_thresh=0.6",
        "model.backbone.bottom_up.scope=5",
        "model.proposal_generator.anchor_matcher.thresholds=[0.4,0.7]",
        "model.roi_heads.mask_head.conv_norm=GN",
    ):
        _, changed = build_pair(*load_pair(recipe, lazy_overrides=[override]))
        assert differences(describe(yaml_model), describe(changed)), override


def test_cpu_turns_sync_bn_into_naive_sync_bn_as_the_yaml_loader_does():
    yaml_cfg, lazy_cfg = load_pair(TABLE_14[0], ["MODEL.DEVICE", "cpu"], ["train.device=cpu"])
    assert lazy_cfg.model.backbone.norm == lazy_cfg.model.backbone.bottom_up.norm == "naiveSyncBN"
    yaml_model, lazy_model = build_pair(yaml_cfg, lazy_cfg)
    assert not differences(describe(yaml_model), describe(lazy_model))
    assert type(lazy_model.backbone.fpn_lateral2.norm).__name__ == "NaiveSyncBatchNorm"


def recipe_values_of_yaml(cfg) -> dict:
    solver, lsj = cfg.SOLVER, cfg.INPUT.LSJ
    return {
        "lr": solver.BASE_LR,
        "momentum": solver.MOMENTUM,
        "nesterov": solver.NESTEROV,
        "weight_decay": solver.WEIGHT_DECAY,
        "weight_decay_norm": solver.WEIGHT_DECAY_NORM,
        "max_iter": solver.MAX_ITER,
        "steps": tuple(solver.STEPS),
        "gamma": solver.GAMMA,
        "warmup": (solver.WARMUP_ITERS, solver.WARMUP_FACTOR, solver.WARMUP_METHOD),
        "batch": solver.IMS_PER_BATCH,
        "reference_world_size": solver.REFERENCE_WORLD_SIZE,
        "checkpoint_period": solver.CHECKPOINT_PERIOD,
        "eval_period": cfg.TEST.EVAL_PERIOD,
        "log_period": solver.LOG_PERIOD,
        "amp": (solver.AMP.ENABLED, solver.AMP.DTYPE),
        "compile": cfg.MODEL.LAMBDA_RESNET.COMPILE,
        "seed": cfg.SEED,
        "check_images": cfg.DATALOADER.CHECK_IMAGES,
        "weights": cfg.MODEL.WEIGHTS,
        "output_dir": cfg.OUTPUT_DIR,
        "train_datasets": tuple(cfg.DATASETS.TRAIN),
        "test_datasets": tuple(cfg.DATASETS.TEST),
        "filter_empty": cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS,
        "num_workers": cfg.DATALOADER.NUM_WORKERS,
        "lsj": (lsj.ENABLED, lsj.IMAGE_SIZE, lsj.MIN_SCALE, lsj.MAX_SCALE),
        "test_size": (cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST),
        "mask_format": cfg.INPUT.MASK_FORMAT,
        "norms": (
            cfg.MODEL.LAMBDA_RESNET.NORM,
            cfg.MODEL.FPN.NORM,
            cfg.MODEL.ROI_BOX_HEAD.NORM,
            cfg.MODEL.ROI_MASK_HEAD.NORM,
        ),
        "freeze_at": cfg.MODEL.BACKBONE.FREEZE_AT,
    }


def recipe_values_of_lazy(cfg) -> dict:
    schedule, loader, train = cfg.lr_multiplier, cfg.dataloader.train, cfg.train
    lsj, resize = loader.mapper.augmentations, cfg.dataloader.test.mapper.augmentations[0]
    backbone, heads = cfg.model.backbone, cfg.model.roi_heads
    return {
        "lr": cfg.optimizer.lr,
        "momentum": cfg.optimizer.momentum,
        "nesterov": cfg.optimizer.nesterov,
        "weight_decay": cfg.optimizer.weight_decay,
        "weight_decay_norm": cfg.optimizer.params.weight_decay_norm,
        "max_iter": train.max_iter,
        "steps": tuple(schedule.steps),
        "gamma": schedule.gamma,
        "warmup": (schedule.warmup_iters, schedule.warmup_factor, schedule.warmup_method),
        "batch": loader.total_batch_size,
        "reference_world_size": train.reference_world_size,
        "checkpoint_period": train.checkpointer.period,
        "eval_period": train.eval_period,
        "log_period": train.log_period,
        "amp": (train.amp.enabled, train.amp.dtype),
        "compile": train.compile_backbone,
        "seed": train.seed,
        "check_images": cfg.dataloader.check_images,
        "weights": train.init_checkpoint,
        "output_dir": train.output_dir,
        "train_datasets": tuple(loader.dataset.names),
        "test_datasets": (cfg.dataloader.test.dataset.names,),
        "filter_empty": loader.dataset.filter_empty,
        "num_workers": loader.num_workers,
        "lsj": (
            lsj._target_.__name__ == "build_lsj_augmentations",
            lsj.image_size,
            lsj.min_scale,
            lsj.max_scale,
        ),
        "test_size": (resize.short_edge_length, resize.max_size),
        "mask_format": loader.mapper.instance_mask_format,
        "norms": (
            backbone.bottom_up.norm,
            backbone.norm,
            heads.box_head.conv_norm,
            heads.mask_head.conv_norm,
        ),
        "freeze_at": backbone.bottom_up.freeze_at,
    }


# How torch runs the update, not what it computes: upstream detectron2's build_optimizer passes
# foreach=True, 0.6's leaves torch's default.
IMPLEMENTATION_FLAGS = ("params", "foreach", "fused", "differentiable")


def optimizer_settings(optimizer, model) -> dict:
    """Each parameter's optimizer type and hyperparameters (learning rate, momentum, decay...)."""
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    return {
        names[id(parameter)]: {
            "type": type(optimizer).__name__,
            **{key: value for key, value in group.items() if key not in IMPLEMENTATION_FLAGS},
        }
        for group in optimizer.param_groups
        for parameter in group["params"]
    }


def lr_multipliers(multiplier, cfg_steps, warmup_iters, max_iter) -> list:
    """The multiplier around every point where it changes, as the LRScheduler hook samples it."""
    points = {0, 1, warmup_iters - 1, warmup_iters, warmup_iters + 1, max_iter - 1}
    points |= {step + delta for step in cfg_steps for delta in (-1, 0, 1)}
    return [
        (point, multiplier(point / max_iter)) for point in sorted(points) if 0 <= point < max_iter
    ]


@pytest.mark.parametrize("world_size", [None, 8])
@pytest.mark.parametrize("recipe", RECIPES)
def test_same_solver_schedule_and_input(recipe, world_size):
    yaml_cfg, lazy_cfg = load_pair(recipe)
    if world_size:  # what the training tools do with REFERENCE_WORLD_SIZE on 8 processes
        yaml_cfg = DefaultTrainer.auto_scale_workers(yaml_cfg, world_size)
        scale_to_world_size(lazy_cfg, world_size)
    assert recipe_values_of_lazy(lazy_cfg) == recipe_values_of_yaml(yaml_cfg)

    with torch.device("meta"):
        model = instantiate(lazy_cfg.model)
    yaml_optimizer = build_optimizer(yaml_cfg, model)
    lazy_cfg.optimizer.params.model = model
    lazy_optimizer = instantiate(lazy_cfg.optimizer)
    assert optimizer_settings(lazy_optimizer, model) == optimizer_settings(yaml_optimizer, model)

    solver = yaml_cfg.SOLVER
    yaml_schedule = build_lr_scheduler(yaml_cfg, yaml_optimizer)._multiplier
    lazy_schedule = instantiate(lazy_cfg.lr_multiplier)
    sampled = lr_multipliers(lazy_schedule, solver.STEPS, solver.WARMUP_ITERS, solver.MAX_ITER)
    assert sampled == lr_multipliers(
        yaml_schedule, solver.STEPS, solver.WARMUP_ITERS, solver.MAX_ITER
    )
    assert sampled[0][1] == solver.WARMUP_FACTOR and sampled[-1][1] == pytest.approx(
        solver.GAMMA ** len(solver.STEPS)
    )

    yaml_mapper = build_mapper(yaml_cfg, is_train=True)
    lazy_mapper = instantiate(lazy_cfg.dataloader.train.mapper)
    assert type(lazy_mapper) is type(yaml_mapper)
    assert {key: repr(value) for key, value in vars(lazy_mapper).items()} == {
        key: repr(value) for key, value in vars(yaml_mapper).items()
    }
    yaml_test = build_mapper(yaml_cfg, is_train=False)
    lazy_test = instantiate(lazy_cfg.dataloader.test.mapper)
    assert type(lazy_test) is type(yaml_test)
    for key in ("is_train", "image_format", "augmentations"):
        assert repr(getattr(lazy_test, key)) == repr(getattr(yaml_test, key)), key


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["train.max_itr=2"],
            "config key train.max_itr does not exist: did you mean "
            "train.max_iter? check its spelling, or write +train.max_itr=... "
            "to add it",
        ),
        (
            ["train.max_iter=2O"],
            "override train.max_iter='2O': train.max_iter takes an integer (it is 600)",
        ),
        (["optimizer.lr=fast"], "optimizer.lr takes a number (it is 0.04)"),
        (["train.amp.enabled=1"], "train.amp.enabled takes true or false"),
        (["train.max_iter"], "malformed override: "),
        (["~train.sed"], "config key train.sed does not exist: did you mean train.seed?"),
        (["train.device=cdua"], "train.device 'cdua' is not a torch device"),
        (["+train.max_iter.x=1"], "override train.max_iter.x: train.max_iter is not a config node"),
    ],
)
def test_bad_overrides_are_named(overrides, message):
    with pytest.raises(ValueError) as error:
        load_lazy_config("lambda_r26_shapes", overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_overrides_set_and_add_values():
    cfg = load_lazy_config(
        "lambda_r26_shapes.py",
        [
            "train.max_iter=2",
            "optimizer.lr=1",
            "model.backbone.bottom_up.scope=null",
            "+model.roi_heads.mask_head.loss_weight=2.0",
            "model.backbone.out_channels=48",
            "~model.backbone.bottom_up.share_position_embeddings",
        ],
    )
    assert (cfg.train.max_iter, cfg.optimizer.lr, cfg.model.backbone.bottom_up.scope) == (
        2,
        1,
        None,
    )
    assert cfg.model.roi_heads.mask_head.loss_weight == 2.0
    assert "share_position_embeddings" not in cfg.model.backbone.bottom_up
    # The FPN width reaches the heads.
    assert cfg.model.proposal_generator.head.in_channels == 48
    assert cfg.model.roi_heads.mask_head.input_shape.channels == 48


def test_yaml_and_lazy_configs_are_told_apart():
    with pytest.raises(ValueError, match="is a yaml config: train it with tools/train_net.py"):
        load_lazy_config("lambda_r26_shapes.yaml")
    with pytest.raises(
        ValueError, match="is a LazyConfig recipe: train it with tools/lazyconfig_train_net.py"
    ):
        load_config("lambda_r26_shapes.py")
    with pytest.raises(FileNotFoundError, match="'lambda_r999.py' is neither a file nor"):
        load_lazy_config("lambda_r999")


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["model.backbone.bottom_up.depth=27"], "error: depth must be one of [26, 50,"),
        (
            ["dataloader.train.dataset.names=[shapes_train]"],
            "error: dataset 'shapes_train' is not registered; did you mean ",
        ),
        (
            ["train.init_checkpoint=/no/such.pth"],
            "error: train.init_checkpoint file '/no/such.pth' does not exist",
        ),
        (
            ["--eval-only"],
            "error: --eval-only needs trained weights: train.init_checkpoint is empty",
        ),
        (
            ["train.deterministic=True", "train.seed=-1"],
            "error: train.deterministic needs a fixed train.seed >= 0, got train.seed=-1",
        ),
        (
            ["dataloader.train.total_batch_size=3", "--num-gpus", "2"],
            "error: dataloader.train.total_batch_size 3 does not split over 2 processes",
        ),
    ],
)
def test_bad_inputs_stop_the_tool_before_it_starts(arguments, message, tmp_path, capsys, shapes):
    options = [item for item in arguments if item.startswith("--") or item.isdigit()]
    overrides = [item for item in arguments if item not in options]
    with pytest.raises(SystemExit) as exit_info:
        lazyconfig_main(
            [
                "--config",
                "lambda_r26_shapes",
                *options,
                *overrides,
                f"train.output_dir={tmp_path / 'run'}",
            ]
        )
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), errors
    assert not (tmp_path / "run" / "config.yaml").exists()


@pytest.fixture
def shapes_in(datasets_root):
    """The shapes datasets registered under ``datasets_root`` for this test."""
    previous = os.environ.get("DETECTRON2_DATASETS")
    os.environ["DETECTRON2_DATASETS"] = str(datasets_root)
    register_shapes_datasets()
    yield
    if previous is None:
        del os.environ["DETECTRON2_DATASETS"]
    else:
        os.environ["DETECTRON2_DATASETS"] = previous
    register_shapes_datasets()


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "model.roi_heads.num_classes=80",
            "error: model.roi_heads.num_classes is 80, but dataset "
            r"'lambda_det_shapes_train' \(annotation file .*\) has 3 "
            "categories: add 'model.roi_heads.num_classes=3' to the "
            "command line",
        ),
        (
            "model.backbone.bottom_up.freeze_at=2",
            "error: model.backbone.bottom_up.freeze_at 2 freezes randomly initialised stages",
        ),
        (
            "model.backbone.bottom_up.norm=FrozenBN",
            "error: model.backbone.bottom_up.norm 'FrozenBN' "
            "freezes randomly initialised statistics",
        ),
    ],
)
def test_the_training_recipe_and_datasets_are_checked(
    override, message, shapes_in, tmp_path, capsys
):
    with pytest.raises(SystemExit) as exit_info:
        lazyconfig_main(
            ["--config", "lambda_r26_shapes", override, f"train.output_dir={tmp_path / 'run'}"]
        )
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.match(message, errors[0]), errors


def test_coco_dataset_registers_the_users_dataset(datasets_root, tmp_path, capsys):
    shapes = datasets_root / "lambda_det_shapes_v1"
    with pytest.raises(SystemExit) as exit_info:  # stopped by the class count: it was read
        lazyconfig_main(
            [
                "--config",
                "lambda_r26_shapes",
                "--coco-dataset",
                "lazy_own_shapes",
                str(shapes / "train.json"),
                str(shapes / "train"),
                "dataloader.train.dataset.names=[lazy_own_shapes]",
                "model.roi_heads.num_classes=80",
                f"train.output_dir={tmp_path / 'run'}",
            ]
        )
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.match(
        r"error: model.roi_heads.num_classes is 80, but dataset 'lazy_own_shapes' \(annotation "
        r"file .*train.json\) has 3 categories: add 'model.roi_heads.num_classes=3' to the "
        r"command line",
        errors[0],
    ), errors


def run_lazy_tool(*args: str, datasets_root: Path, timeout: int = 900):
    """tools/lazyconfig_train_net.py with this checkout's lambda_det, also in a worktree."""
    return run_tool(
        "lazyconfig_train_net.py",
        *args,
        datasets_root=datasets_root,
        timeout=timeout,
        PYTHONPATH=str(REPO_ROOT),
    )


@pytest.mark.slow
@pytest.mark.e2e
def test_the_tool_reports_a_bad_override_in_one_line(tmp_path):
    result = run_lazy_tool(
        "--config",
        "lambda_r26_shapes",
        "train.max_itr=2",
        f"train.output_dir={tmp_path}",
        datasets_root=tmp_path,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: config key train.max_itr does not exist: did you mean train.max_iter? check its "
        "spelling, or write +train.max_itr=... to add it"
    )


TINY_TRAINING = [
    "train.max_iter=2",
    "model.backbone.bottom_up.width_multiplier=0.25",
    "model.backbone.bottom_up.scope=3",
    "dataloader.train.total_batch_size=2",
    "dataloader.train.num_workers=0",
    "dataloader.test.num_workers=0",
    "model.proposal_generator.post_nms_topk=[250,50]",
    "model.roi_heads.box_predictor.test_topk_per_image=20",
    "train.device=cpu",
]


@pytest.mark.slow
@pytest.mark.e2e
def test_the_tool_trains_checkpoints_and_evaluates_on_the_cpu(
    tmp_path, small_datasets_root, small_shapes, capsys
):
    """The training as a child process; the evaluation and the refusal by main() here."""
    output = tmp_path / "run"
    result = run_lazy_tool(
        "--config",
        "lambda_r26_shapes",
        *TINY_TRAINING,
        f"train.output_dir={output}",
        datasets_root=small_datasets_root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (output / "last_checkpoint").read_text() == "model_final.pth"
    checkpoint = torch.load(output / "model_final.pth", weights_only=True)
    assert checkpoint["iteration"] == 1 and {"optimizer", "hooks"} <= set(checkpoint["trainer"])
    # width_multiplier=0.25 from the command line: res5 is 2048 * 0.25 channels wide.
    assert checkpoint["model"]["backbone.bottom_up.res5.1.conv1.weight"].shape[:2] == (128, 512)
    metrics = [json.loads(line) for line in (output / "metrics.json").read_text().splitlines()]
    assert any("total_loss" in record for record in metrics)
    assert "\x1b[" not in (output / "log.txt").read_text()
    assert (output / "config.yaml").is_file()
    results = json.loads((output / "eval_results.json").read_text())["results"]
    assert {"AP", "APs", "APm", "APl"} <= set(results["bbox"]) & set(results["segm"])

    # The trained weights evaluate to the same numbers; the finished run is not trained over.
    evaluate = ["--config", "lambda_r26_shapes", "--eval-only", *TINY_TRAINING]
    evaluate += [f"train.init_checkpoint={output / 'model_final.pth'}"]
    assert lazyconfig_main([*evaluate, f"train.output_dir={tmp_path / 'eval'}"]) == 0
    assert json.loads((tmp_path / "eval" / "eval_results.json").read_text())["results"] == results
    retrain = ["--config", "lambda_r26_shapes", *TINY_TRAINING, f"train.output_dir={output}"]
    with pytest.raises(SystemExit) as exit_info:
        lazyconfig_main(retrain)
    assert exit_info.value.code == 2 and "already holds a run" in capsys.readouterr().err


class Interrupted(Exception):
    pass


@pytest.mark.slow
def test_deterministic_training_resumes_exactly(tmp_path, shapes_in, monkeypatch):
    from lambda_det.engine.deterministic import DeterministicTrainLoader

    monkeypatch.setattr(lazy_training, "evaluate", lambda cfg, model: None)  # training only

    def recipe(folder):
        tiny = [item for item in TINY_TRAINING if not item.startswith("train.max_iter=")]
        return load_lazy_config(
            "lambda_r26_shapes",
            [
                *tiny,
                "train.max_iter=4",
                "train.checkpointer.period=2",
                "train.deterministic=True",
                "train.seed=7",
                f"train.output_dir={folder}",
            ],
        )

    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    lazy_training.train(recipe(straight), resume=False)
    load, loaded = DeterministicTrainLoader.load, []

    def load_two_iterations(self, position):  # batch 2: the fifth image is iteration 2's
        loaded.append(position)
        if len(loaded) > 4:
            raise Interrupted
        return load(self, position)

    monkeypatch.setattr(DeterministicTrainLoader, "load", load_two_iterations)
    with pytest.raises(Interrupted):
        lazy_training.train(recipe(interrupted), resume=False)
    monkeypatch.setattr(DeterministicTrainLoader, "load", load)
    assert (interrupted / "last_checkpoint").read_text() == "model_0000001.pth"
    lazy_training.train(recipe(interrupted), resume=True)
    expected = torch.load(straight / "model_final.pth", weights_only=True)
    resumed = torch.load(interrupted / "model_final.pth", weights_only=True)
    assert expected["iteration"] == resumed["iteration"] == 3
    for name, value in expected["model"].items():
        assert torch.equal(value, resumed["model"][name]), name


def test_scaling_keeps_images_per_process():
    cfg = load_lazy_config("lambda_r101_mask_rcnn.py")
    scaled = scale_to_world_size(copy.deepcopy(cfg), 16)
    assert (scaled.dataloader.train.total_batch_size, scaled.train.max_iter) == (64, 520000)
    assert scaled.optimizer.lr == pytest.approx(0.08)
    assert list(scaled.lr_multiplier.steps) == [468000, 494000, 507000]
    assert scale_to_world_size(copy.deepcopy(cfg), 64).train.max_iter == 130000


@pytest.mark.slow
@pytest.mark.e2e
def test_a_recipe_without_a_test_set_trains_and_evaluates_nothing(tmp_path, shapes):
    """As DATASETS.TEST () in a yaml config: no final evaluation (detectron2 would assert on an
    empty list of test datasets after training)."""
    from conftest import LAZY_TINY_OVERRIDES

    from lambda_det.cli import lazyconfig_train_net

    argv = ["--config", "lambda_r26_shapes", *LAZY_TINY_OVERRIDES, "train.max_iter=1"]
    argv += ["dataloader.test.dataset.names=[]", f"train.output_dir={tmp_path}"]
    assert lazyconfig_train_net.main(argv) == 0
    assert (tmp_path / "model_final.pth").is_file()
    assert not (tmp_path / "eval_results.json").exists()


# ---- a LazyConfig yaml is data: what it names is allow-listed ----


# A recipe that builds a torchvision ResNet-50 as it loads: saved, a 180 MB yaml that takes over
# 8 minutes to write and read on 2 cores. Left out: it saves functions of its own file, the case
# the new_baselines recipes (lambdas) already cover.
HEAVY_RECIPES = {"Misc/torchvision_imagenet_R_50.py"}


def detectron2_recipes() -> list:
    """Every .py config that the installed detectron2 ships (its model_zoo/configs)."""
    import detectron2.model_zoo

    root = Path(detectron2.model_zoo.__file__).parent / "configs"
    names = sorted(str(path.relative_to(root)) for path in root.rglob("*.py"))
    return [name for name in names if name not in HEAVY_RECIPES]


def saved_recipe(recipe: Path, tmp_path: Path) -> Path:
    """``recipe`` written by detectron2's LazyConfig.save, as users pass configs around."""
    saved = tmp_path / (recipe.stem + ".yaml")
    LazyConfig.save(LazyConfig.load(str(recipe)), str(saved))
    return saved


@pytest.mark.parametrize("recipe", detectron2_recipes() or ["(none shipped)"])
def test_every_detectron2_recipe_loads_back_from_the_yaml_it_saves(recipe, tmp_path):
    """What detectron2 loads back of its own recipes loads the same through the allow-list.
    A recipe that holds a lambda or a function of its own file is saved as a name that no
    loader can import (detectron2 says "cannot be loaded" and also writes a .pkl): one line."""
    import detectron2.model_zoo

    if recipe == "(none shipped)":
        pytest.skip("this detectron2 ships no model_zoo/configs")
    saved = saved_recipe(Path(detectron2.model_zoo.__file__).parent / "configs" / recipe, tmp_path)
    try:
        theirs = LazyConfig.load(str(saved))
    except yaml.constructor.ConstructorError:  # a name detectron2 cannot import either
        with pytest.raises(ConfigFileError, match=f"LazyConfig {re.escape(str(saved))}, line "):
            load_lazy_config_file(str(saved))
        return
    assert load_lazy_config_file(str(saved)) == theirs


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_lambda_det_recipe_loads_back_from_the_yaml_it_saves(recipe, tmp_path):
    saved = saved_recipe(LAZY_ROOT / recipe, tmp_path)
    assert load_lazy_config_file(str(saved)) == LazyConfig.load(str(saved))


def test_the_allow_lists_functions_are_those_detectron2s_recipes_call():
    """Each name of TRUSTED_FUNCTIONS is a function (a class is trusted by its package), and
    each importable function that a shipped recipe names, detectron2's or lambda_det's, is
    among them."""
    import detectron2.model_zoo

    trusted = [locate(name) for name in TRUSTED_FUNCTIONS]
    assert not any(inspect.isclass(function) for function in trusted)
    roots = [Path(detectron2.model_zoo.__file__).parent / "configs", LAZY_ROOT]
    named = set()
    for recipe in (path for root in roots for path in root.rglob("*.py")):
        cfg = LazyConfig.load(str(recipe))
        named |= set(_targets(OmegaConf.to_container(cfg, resolve=False)))
    functions = {target for target in named if not inspect.isclass(target) and importable(target)}
    assert functions and functions <= set(trusted), functions - set(trusted)


def importable(function) -> bool:
    """Whether a saved yaml can name ``function`` (not one that a recipe defines itself, as
    Misc/torchvision_imagenet_R_50.py does: LazyConfig.save writes no importable name)."""
    try:
        return locate(f"{function.__module__}.{function.__qualname__}") is function
    except ImportError:
        return False


def _targets(node):
    """The callables a .py recipe (its config as plain containers) names as _target_s."""
    if isinstance(node, dict):
        if callable(node.get("_target_")):
            yield node["_target_"]
        for value in node.values():
            yield from _targets(value)
    elif isinstance(node, list):
        for value in node:
            yield from _targets(value)


def write_lazy_yaml(tmp_path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


# Each a LazyConfig yaml whose ``model`` creates the file MARKER when detectron2 loads and
# instantiates it, and the key and target the refusal names.
UNTRUSTED_MODELS = {
    "a plain _target_": (
        "model: {_target_: os.system, command: 'touch MARKER'}",
        "model._target_ names 'os.system'",
    ),
    "nested in a list": (
        "model: {_target_: torch.nn.ModuleList, modules: [{_target_: os.system, "
        "command: 'touch MARKER'}]}",
        "model.modules[0]._target_ names 'os.system'",
    ),
    "made by an interpolation": (
        "model: '${oc.create:{_target_: os.system, command: \"touch MARKER\"}}'",
        "model._target_ names 'os.system'",
    ),
    "spelt by an interpolation": (
        "module: os\nmodel: {_target_: '${module}.system', command: 'touch MARKER'}",
        "model._target_ names 'os.system'",
    ),
    "reached through a trusted module": (
        "model: {_target_: detectron2.config.lazy.os.system, command: 'touch MARKER'}",
        "model._target_ names 'detectron2.config.lazy.os.system'",
    ),
    "a trusted package's function that runs a file": (
        "model: {_target_: detectron2.config.LazyConfig.load, filename: RECIPE}",
        "model._target_ names 'detectron2.config.LazyConfig.load'",
    ),
    "a trusted package's function that writes a file": (
        "model: {_target_: lambda_det.utils.atomic.atomic_write, path: MARKER, data: x}",
        "model._target_ names 'lambda_det.utils.atomic.atomic_write'",
    ),
    "an object (!!python/name)": (
        "model: {_target_: !!python/name:os.system '', command: 'touch MARKER'}",
        "line 1: the yaml tag !!python/name:os.system names os.system",
    ),
    "an object built at load (!!python/object/apply)": (
        "model: !!python/object/apply:os.system ['touch MARKER']",
        "line 1: the yaml tag !!python/object/apply:os.system names os.system",
    ),
}


@pytest.mark.parametrize("case", UNTRUSTED_MODELS)
def test_a_callable_outside_the_allow_list_is_refused_in_one_line(case, tmp_path):
    text, named = UNTRUSTED_MODELS[case]
    marker = tmp_path / "marker"
    recipe = tmp_path / "evil.py"  # what LazyConfig.load runs, when named
    recipe.write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = write_lazy_yaml(
        tmp_path, text.replace("MARKER", str(marker)).replace("RECIPE", str(recipe)) + "\n"
    )
    with pytest.raises(UntrustedConfigError) as refused:
        load_lazy_config_file(str(config))
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"LazyConfig {config}")
    assert named in message and "which a LazyConfig yaml may not name" in message
    assert f"pass --trust-config {config} to python -m lambda_det.d2tool before SCRIPT" in message
    assert not marker.exists()
    # Without the guard: detectron2's own loading (trusted), then instantiate, runs the code.
    with contextlib.suppress(Exception):
        instantiate(load_lazy_config_file(str(config), trusted=True).model)
    assert marker.exists()


def test_no_module_outside_the_allow_list_is_imported_to_check_a_name(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    (tmp_path / "planted.py").write_text(f"open({str(marker)!r}, 'w').close()\nBuild = dict\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = write_lazy_yaml(tmp_path, "model: {_target_: planted.Build}\n")
    with pytest.raises(UntrustedConfigError, match="model._target_ names 'planted.Build'"):
        load_lazy_config_file(str(config))
    assert not marker.exists()
    locate("planted.Build")  # detectron2's instantiate finds a name by importing its module
    assert marker.exists()


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "model: {_target_: detectron2.modeling.ResNt}",
            "model._target_ names 'detectron2.modeling.ResNt', which does not exist "
            "(ImportError): check its spelling",
        ),
        (
            "model: {norm: !!python/name:detectron2._cfg_loader1234.recipe.py.%3Clambda%3E ''}",
            "line 1: the yaml tag !!python/name:detectron2._cfg_loader1234.recipe.py.<lambda> "
            "names detectron2._cfg_loader1234.recipe.py.<lambda>, which is no importable name",
        ),
        (
            "model: {s: !!python/object/new:detectron2.layers.ShapeSpec [1, 2, 3, 4, 5, 6]}",
            "line 1: the yaml tag !!python/object/new:detectron2.layers.ShapeSpec does not build: ",
        ),
        (
            "model: {s: !!python/object/new:detectron2.layers.ShapeSpec {args: [1]}}",
            "line 1: the yaml tag !!python/object/new:detectron2.layers.ShapeSpec is refused",
        ),
    ],
)
def test_a_name_that_builds_nothing_is_one_line(text, message, tmp_path):
    config = write_lazy_yaml(tmp_path, text + "\n")
    with pytest.raises(ConfigFileError) as refused:
        load_lazy_config_file(str(config))
    assert not isinstance(refused.value, UntrustedConfigError)
    assert str(refused.value).startswith(f"LazyConfig {config}")
    assert message in str(refused.value)


def test_what_the_allow_list_takes_loads_as_detectron2_loads_it(tmp_path):
    config = write_lazy_yaml(
        tmp_path,
        "model: {_target_: torch.nn.Linear, in_features: 2, out_features: '${width}'}\n"
        "width: 3\n"
        "shape: !!python/object/new:detectron2.layers.shape_spec.ShapeSpec [8, 7, 7, null]\n"
        "block: !!python/name:detectron2.modeling.backbone.resnet.BottleneckBlock ''\n"
        "stages: {_target_: detectron2.modeling.ResNet.make_default_stages, depth: 50}\n"
        "unset: ???\n"
        "dangling: ${nowhere}\n",
    )
    ours = load_lazy_config_file(str(config))
    assert ours == LazyConfig.load(str(config))
    assert ours.shape == ShapeSpec(channels=8, height=7, width=7)
    assert isinstance(instantiate(ours.model), nn.Linear)


def test_a_target_may_be_an_object():
    cfg = OmegaConf.create(
        {"model": {"_target_": nn.Linear, "parts": [{"_target_": os.system}]}},
        flags={"allow_objects": True},
    )
    with pytest.raises(UntrustedConfigError, match=r"model.parts\[0\]._target_ names posix.system"):
        check_lazy_targets(cfg, "recipe.yaml")
    del cfg.model.parts
    check_lazy_targets(cfg, "recipe.yaml")
