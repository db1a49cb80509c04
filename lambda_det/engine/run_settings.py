"""What a training or evaluation run reads, from either config system: a yaml config
(tools/train_net.py, keys such as ``SOLVER.BASE_LR``) or a LazyConfig recipe
(tools/lazyconfig_train_net.py, keys such as ``optimizer.lr``), read into one
:class:`RunSettings` of values with their keys. The checks before launch
(:mod:`.preflight`, :func:`lambda_det.data.checks.check_run_datasets`,
:func:`lambda_det.checkpoint.evaluation_weights`) take these values, so both tools run the same
checks and name each value by the key the user wrote.
"""

import sys
from typing import Callable, NamedTuple, Optional

from detectron2.data import transforms as T
from detectron2.modeling import Backbone
from detectron2.utils.registry import locate
from omegaconf import DictConfig, ListConfig, OmegaConf

from lambda_det.data.checks import DataSettings, yaml_data_settings
from lambda_det.data.mapper import build_lsj_augmentations
from lambda_det.engine.preflight import BackboneSettings, TrainingSettings
from lambda_det.modeling import LambdaResNetBackbone
from lambda_det.modeling.build import LAMBDA_DET_BACKBONES, backbone_setting
from lambda_det.solver import warmup_multistep
from lambda_det.utils.errors import UserError
from lambda_det.utils.run_defaults import AMP_DTYPE, CHECK_IMAGES, LOG_PERIOD
from lambda_det.utils.setting import Setting, is_integer

__all__ = [
    "RunSettings",
    "yaml_run_settings",
    "lazy_run_settings",
    "yaml_training_settings",
    "lazy_training_settings",
    "lazy_data_settings",
]


class RunSettings(NamedTuple):
    """What a run reads, each value with the key that sets it."""

    device: Setting
    output_dir: Setting
    data: DataSettings
    training: TrainingSettings  # its ``weights``: the initial (or evaluated) weights


def yaml_run_settings(cfg) -> RunSettings:
    """The run settings of a yaml config (tools/train_net.py)."""
    return RunSettings(
        device=Setting("MODEL.DEVICE", cfg.MODEL.DEVICE),
        output_dir=Setting("OUTPUT_DIR", cfg.OUTPUT_DIR),
        data=yaml_data_settings(cfg),
        training=yaml_training_settings(cfg),
    )


def lazy_run_settings(cfg: DictConfig) -> RunSettings:
    """The run settings of a LazyConfig recipe (tools/lazyconfig_train_net.py)."""
    return RunSettings(
        device=Setting("train.device", cfg.train.device),
        output_dir=Setting("train.output_dir", cfg.train.output_dir),
        data=lazy_data_settings(cfg),
        training=lazy_training_settings(cfg),
    )


def _names(node) -> tuple:
    names = node.names
    return (names,) if isinstance(names, str) else tuple(names)


def lazy_data_settings(cfg: DictConfig) -> DataSettings:
    """The data settings of a recipe: its loaders' dataset names; the model predicts masks when
    its ROI heads have ``mask_in_features`` (detectron2's StandardROIHeads)."""
    train, test = cfg.dataloader.train, cfg.dataloader.test
    num_classes = OmegaConf.select(cfg, "model.roi_heads.num_classes", default=None)
    return DataSettings(
        train=Setting("dataloader.train.dataset.names", _names(train.dataset)),
        test=Setting("dataloader.test.dataset.names", _names(test.dataset)),
        filter_empty=train.dataset.get("filter_empty", True),
        masks=OmegaConf.select(cfg, "model.roi_heads.mask_in_features", default=None) is not None,
        num_classes=(
            None if num_classes is None else Setting("model.roi_heads.num_classes", num_classes)
        ),
        check_images=Setting(
            "dataloader.check_images", cfg.dataloader.get("check_images", CHECK_IMAGES)
        ),
        image_format=train.mapper.get("image_format", "BGR"),
    )


def yaml_training_settings(cfg) -> TrainingSettings:
    """The training settings of a yaml config (tools/train_net.py)."""
    solver, lsj = cfg.SOLVER, cfg.INPUT.LSJ
    steps = None
    if solver.LR_SCHEDULER_NAME == "WarmupMultiStepLR":  # detectron2 drops steps past MAX_ITER
        steps = Setting("SOLVER.STEPS", _kept_steps(solver.STEPS, solver.MAX_ITER))
    if lsj.ENABLED:
        input_size = Setting("INPUT.LSJ.IMAGE_SIZE", lsj.IMAGE_SIZE)
    else:  # the largest short-side resize, of a square image
        input_size = Setting(
            "INPUT.MIN_SIZE_TRAIN", min(max(cfg.INPUT.MIN_SIZE_TRAIN), cfg.INPUT.MAX_SIZE_TRAIN)
        )
    return TrainingSettings(
        learning_rate=Setting("SOLVER.BASE_LR", solver.BASE_LR),
        max_iter=Setting("SOLVER.MAX_ITER", solver.MAX_ITER),
        lr_steps=steps,
        amp_dtype=Setting("SOLVER.AMP.DTYPE", solver.AMP.DTYPE) if solver.AMP.ENABLED else None,
        deterministic=Setting("DATALOADER.DETERMINISTIC", cfg.DATALOADER.DETERMINISTIC),
        seed=Setting("SEED", cfg.SEED),
        lsj=(
            Setting("INPUT.LSJ.IMAGE_SIZE", lsj.IMAGE_SIZE),
            Setting("INPUT.LSJ.MIN_SCALE", lsj.MIN_SCALE),
            Setting("INPUT.LSJ.MAX_SCALE", lsj.MAX_SCALE),
        )
        if lsj.ENABLED
        else None,
        at_least_one=(
            Setting("SOLVER.LOG_PERIOD", solver.LOG_PERIOD),
            Setting("SOLVER.CHECKPOINT_PERIOD", solver.CHECKPOINT_PERIOD),
        ),
        at_least_zero=(
            Setting("SOLVER.MOMENTUM", solver.MOMENTUM),
            Setting("SOLVER.WEIGHT_DECAY", solver.WEIGHT_DECAY),
            Setting("SOLVER.WARMUP_ITERS", solver.WARMUP_ITERS),
            Setting("TEST.EVAL_PERIOD", cfg.TEST.EVAL_PERIOD),
            Setting("DATALOADER.NUM_WORKERS", cfg.DATALOADER.NUM_WORKERS),
        ),
        batch=Setting("SOLVER.IMS_PER_BATCH", solver.IMS_PER_BATCH),
        input_size=input_size,
        weights=Setting("MODEL.WEIGHTS", cfg.MODEL.WEIGHTS),
        backbone=_yaml_backbone(cfg),
        finite=_yaml_finite(solver),
        test_size=_test_size(
            "INPUT.MAX_SIZE_TEST", cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST
        ),
    )


# detectron2's float solver keys that must be finite (CLIP_GRADIENTS.NORM_TYPE may be inf: the
# max norm); None (WEIGHT_DECAY_BIAS: WEIGHT_DECAY's) or a key of another detectron2 is left out.
_YAML_FINITE = (
    "GAMMA",
    "WARMUP_FACTOR",
    "BASE_LR_END",
    "BIAS_LR_FACTOR",
    "WEIGHT_DECAY_NORM",
    "WEIGHT_DECAY_BIAS",
    "CLIP_GRADIENTS.CLIP_VALUE",
)


def _yaml_finite(solver) -> tuple:
    settings = []
    for key in _YAML_FINITE:
        node = solver
        for part in key.split("."):
            node = node.get(part) if hasattr(node, "get") else None
        if node is not None:
            settings.append(Setting(f"SOLVER.{key}", node))
    return tuple(settings)


def _test_size(key: str, short_side, max_size) -> Optional[Setting]:
    """The side of a square image resized by detectron2's ``ResizeShortestEdge(short_side,
    max_size)`` at evaluation, with ``key``, the maximum size's key (lowering it bounds every
    image); None when it does not resize (a short side of 0) or the values are not sizes."""
    sides = list(short_side) if isinstance(short_side, (list, tuple, ListConfig)) else [short_side]
    if not sides or not all(is_integer(side) and side > 0 for side in [*sides, max_size]):
        return None
    return Setting(key, min(min(sides), max_size))


def _yaml_backbone(cfg) -> Optional[BackboneSettings]:
    if cfg.MODEL.BACKBONE.NAME not in LAMBDA_DET_BACKBONES:
        return None
    norm_key = "MODEL.LAMBDA_RESNET.NORM"
    norm_from = "MODEL.RESNETS.NORM" if cfg.MODEL.LAMBDA_RESNET.NORM is None else norm_key
    return BackboneSettings(
        norm=Setting(norm_from, backbone_setting(cfg, "NORM")),
        norm_key=norm_key,
        freeze_at=Setting("MODEL.BACKBONE.FREEZE_AT", cfg.MODEL.BACKBONE.FREEZE_AT),
    )


def _calls(node, function: Callable) -> bool:
    """Whether a LazyConfig node is ``LazyCall(function)(...)`` (its target as the function
    itself or by its dotted name)."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    names = {
        f"{function.__module__}.{function.__qualname__}",
        f"{function.__module__.rpartition('.')[0]}.{function.__qualname__}",
    }
    return target is function or target in names


def lazy_training_settings(cfg: DictConfig) -> TrainingSettings:
    """The training settings of a LazyConfig recipe (tools/lazyconfig_train_net.py); a recipe's
    own optimizer, schedule or augmentations are checked where they are lambda_det's or
    torch's usual ones (``lr``, ``momentum``, ``weight_decay``)."""
    train, max_iter = cfg.train, cfg.train.max_iter
    steps = None
    multistep = _calls(cfg.lr_multiplier, warmup_multistep)
    if multistep:  # drops steps at or past max_iter
        last = max_iter - 1 if is_integer(max_iter) else max_iter
        steps = Setting("lr_multiplier.steps", _kept_steps(cfg.lr_multiplier.steps, last))
    augmentations = OmegaConf.select(cfg, "dataloader.train.mapper.augmentations", default=None)
    lsj = input_size = None
    if _calls(augmentations, build_lsj_augmentations):
        prefix = "dataloader.train.mapper.augmentations."
        lsj = tuple(
            Setting(prefix + name, augmentations[name])
            for name in ("image_size", "min_scale", "max_scale")
        )
        input_size = lsj[0]
    optional_at_least_zero = [
        (f"optimizer.{name}", cfg.optimizer.get(name)) for name in ("momentum", "weight_decay")
    ]
    optional_at_least_zero.append(
        ("dataloader.train.num_workers", cfg.dataloader.train.get("num_workers"))
    )
    amp = train.get("amp", {})
    return TrainingSettings(
        learning_rate=Setting("optimizer.lr", cfg.optimizer.get("lr")),
        max_iter=Setting("train.max_iter", max_iter),
        lr_steps=steps,
        amp_dtype=(
            Setting("train.amp.dtype", amp.get("dtype", AMP_DTYPE))
            if amp.get("enabled", False)
            else None
        ),
        deterministic=Setting("train.deterministic", train.get("deterministic", False)),
        seed=Setting("train.seed", train.get("seed", -1)),
        lsj=lsj,
        at_least_one=(
            Setting("train.log_period", train.get("log_period", LOG_PERIOD)),
            Setting("train.checkpointer.period", train.checkpointer.get("period")),
        ),
        at_least_zero=(
            Setting("train.eval_period", train.get("eval_period", 0)),
            *(Setting(key, value) for key, value in optional_at_least_zero if value is not None),
        ),
        batch=Setting("dataloader.train.total_batch_size", cfg.dataloader.train.total_batch_size),
        input_size=input_size,
        weights=Setting("train.init_checkpoint", train.init_checkpoint),
        backbone=_lazy_backbone(cfg),
        finite=tuple(
            Setting(f"lr_multiplier.{name}", cfg.lr_multiplier.get(name))
            for name in ("gamma", "warmup_factor")
            if multistep and cfg.lr_multiplier.get(name) is not None
        ),
        test_size=_lazy_test_size(cfg),
    )


def _lazy_test_size(cfg: DictConfig) -> Optional[Setting]:
    """:func:`_test_size` of a recipe's test mapper, when it resizes with detectron2's
    ``ResizeShortestEdge`` (None otherwise)."""
    augmentations = OmegaConf.select(cfg, "dataloader.test.mapper.augmentations", default=None)
    for index, augmentation in enumerate(augmentations or ()):
        if _calls(augmentation, T.ResizeShortestEdge):
            return _test_size(
                f"dataloader.test.mapper.augmentations.{index}.max_size",
                augmentation.get("short_edge_length"),
                augmentation.get("max_size", sys.maxsize),
            )
    return None


def _target_class(node) -> Optional[type]:
    """The class a LazyConfig node calls (its ``_target_`` as the class, or the dotted name of one
    of lambda_det's: nothing else is imported here), None for anything else."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    if isinstance(target, str):
        target = locate(target) if target.startswith("lambda_det.") else None
    return target if isinstance(target, type) else None


def check_lazy_bottom_up(cfg: DictConfig) -> None:
    """Refuse (one line) an FPN ``bottom_up`` that is not a detectron2 ``Backbone`` (detectron2's
    FPN asserts it with an empty message), naming the backbone to use for a LambdaResNet."""
    bottom_up = OmegaConf.select(cfg, "model.backbone.bottom_up", default=None)
    target = _target_class(bottom_up)
    if target is None or issubclass(target, Backbone):
        return
    raise UserError(
        f"model.backbone.bottom_up calls {target.__module__}.{target.__qualname__}, which is "
        f"not a detectron2 Backbone, as FPN's bottom_up must be; use "
        f"L(lambda_det.LambdaResNetBackbone)(...) (same arguments) for a LambdaResNet"
    )


def _lazy_backbone(cfg: DictConfig) -> Optional[BackboneSettings]:
    check_lazy_bottom_up(cfg)
    bottom_up = OmegaConf.select(cfg, "model.backbone.bottom_up", default=None)
    if not _calls(bottom_up, LambdaResNetBackbone):
        return None
    prefix = "model.backbone.bottom_up."
    return BackboneSettings(
        norm=Setting(prefix + "norm", bottom_up.get("norm")),
        norm_key=prefix + "norm",
        freeze_at=Setting(prefix + "freeze_at", bottom_up.get("freeze_at", 0)),
    )


def _kept_steps(steps, last) -> list:
    """The steps a multi-step schedule keeps: all but the integers past ``last`` (anything
    else stays, to be refused by name)."""
    return [step for step in steps if not (is_integer(step) and is_integer(last) and step > last)]
