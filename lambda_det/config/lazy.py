"""LazyConfig recipes (the .py configs of configs/LazyConfigs/): loading, checked command-line
overrides, the CPU norm swap and the linear scaling to a world size that the yaml configs get
from lambda_det.config and detectron2's ``DefaultTrainer.auto_scale_workers``.

A recipe defines ``model``, ``dataloader`` (``train``, ``test``, ``evaluator``), ``optimizer``,
``lr_multiplier`` and ``train`` (tools/lazyconfig_train_net.py reads them).
"""

import logging
import os
from typing import Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from lambda_det.compat import import_detectron2

import_detectron2()  # quietly, and with a helpful error when it is missing

from detectron2.config import LazyConfig
from detectron2.utils.file_io import PathManager

from lambda_det.config import adapt_norms_to_device, config_keys, did_you_mean
from lambda_det.config.config import _load_plain_yaml
from lambda_det.utils.errors import MissingFileError, UserError
from lambda_det.utils.setting import shown

__all__ = [
    "load_lazy_config",
    "resolve_lazy_config_file",
    "apply_overrides",
    "scale_to_world_size",
    "load_lazy_config_file",
    "REQUIRED_KEYS",
]

logger = logging.getLogger(__name__)

REQUIRED_KEYS = (
    "model",
    "dataloader.train",
    "dataloader.test",
    "dataloader.evaluator",
    "optimizer",
    "lr_multiplier",
    "train.output_dir",
    "train.max_iter",
    "train.device",
)
_ABSENT = object()


def resolve_lazy_config_file(name: str) -> str:
    """``name`` itself when it is a file, else the shipped recipe of that name (".py" may be
    left out: "lambda_r152_mask_rcnn" is LazyConfigs/.../lambda_r152_mask_rcnn.py).

    Raises:
        FileNotFoundError: no such file or shipped recipe.
        ValueError: ``name`` is a yaml config.
    """
    from lambda_det.config.shipped import get_config_file

    if os.path.isfile(name):
        path = name
    else:
        path = get_config_file(name if os.path.splitext(name)[1] else name + ".py")
    if not path.endswith(".py"):
        raise UserError(
            f"{path} is a yaml config: train it with tools/train_net.py, or pass a "
            f"LazyConfig .py recipe (e.g. lambda_r152_mask_rcnn.py)"
        )
    return path


def _check_value_type(key: str, old, new) -> None:
    """A number stays a number and a flag a flag (a typo such as ``max_iter=2O`` would otherwise
    surface mid-run)."""
    if old is None or new is None:
        return
    if isinstance(old, bool):
        wrong, kind = not isinstance(new, bool), "true or false"
    elif isinstance(old, int):
        wrong, kind = isinstance(new, bool) or not isinstance(new, int), "an integer"
    elif isinstance(old, float):
        wrong, kind = isinstance(new, bool) or not isinstance(new, (int, float)), "a number"
    else:
        return
    if wrong:
        raise UserError(f"override {key}={new!r}: {key} takes {kind} (it is {old!r})")


def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """Hydra-syntax overrides, in place: ``key=value`` sets, ``+key=value`` adds (e.g. an
    argument the recipe leaves at its default), ``~key`` removes (e.g. another mixer's options).
    Unlike detectron2's ``LazyConfig.apply_overrides``, a key set or removed must exist (a
    misspelt key would otherwise be added and ignored) and a value keeps its kind.

    Raises:
        ValueError: a malformed override, an unknown key, or a value of the wrong kind.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as error:
        raise UserError(
            f"malformed override: {' '.join(str(error).split())} (write "
            f"key=value, e.g. train.max_iter=100)"
        ) from None
    for override in parsed:
        key = override.key_or_group
        old = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)
        if old is _ABSENT and not (override.is_add() or override.is_force_add()):
            keys = config_keys(OmegaConf.to_container(cfg, resolve=False))
            raise UserError(
                f"config key {key} does not exist: {did_you_mean(key, keys)}check "
                f"its spelling, or write +{key}=... to add it"
            )
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key, default=None) if parent_key else cfg
        if not isinstance(parent, DictConfig):
            raise UserError(f"override {key}: {parent_key} is not a config node")
        if override.is_delete():
            del parent[leaf]
            continue
        value = override.value()
        if old is not _ABSENT:
            _check_value_type(key, old, value)
        OmegaConf.update(cfg, key, value, merge=True)
    return cfg


def scale_to_world_size(cfg: DictConfig, world_size: int) -> DictConfig:
    """Keep the images per process of ``train.reference_world_size`` processes (0: off) on
    ``world_size`` ones, as detectron2's ``auto_scale_workers`` does for
    SOLVER.REFERENCE_WORLD_SIZE:
    batch and LR scale linearly, max_iter, steps, warmup, evaluation and checkpoint periods
    inversely. In place; returns ``cfg``.

    Raises:
        ValueError: the batch does not split over the reference world size.
    """
    reference = cfg.train.get("reference_world_size", 0)
    if not reference or reference == world_size:
        return cfg
    batch = cfg.dataloader.train.total_batch_size
    if batch % reference:
        raise UserError(
            f"dataloader.train.total_batch_size {batch} does not split over "
            f"train.reference_world_size {reference}: use a multiple of it"
        )
    ratio = world_size / reference

    def fewer(value: int) -> int:
        return int(round(value / ratio))

    cfg.dataloader.train.total_batch_size = int(round(batch * ratio))
    cfg.optimizer.lr = cfg.optimizer.lr * ratio
    cfg.train.max_iter = fewer(cfg.train.max_iter)
    cfg.train.eval_period = fewer(cfg.train.eval_period)
    cfg.train.checkpointer.period = fewer(cfg.train.checkpointer.period)
    if "steps" in cfg.lr_multiplier:
        cfg.lr_multiplier.steps = [fewer(step) for step in cfg.lr_multiplier.steps]
    if "warmup_iters" in cfg.lr_multiplier:
        cfg.lr_multiplier.warmup_iters = fewer(cfg.lr_multiplier.warmup_iters)
    cfg.train.reference_world_size = world_size
    logger.info(
        "Scaled the recipe from %d to %d processes: batch %d, LR %g, %d iterations",
        reference,
        world_size,
        cfg.dataloader.train.total_batch_size,
        cfg.optimizer.lr,
        cfg.train.max_iter,
    )
    return cfg


def _check_recipe(cfg: DictConfig, path: str) -> None:
    for key in REQUIRED_KEYS:
        if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
            raise UserError(
                f"LazyConfig {path} has no {key}: a recipe defines model, "
                f"dataloader (train, test, evaluator), optimizer, lr_multiplier "
                f"and train (see configs/LazyConfigs/common/)"
            )
    try:
        torch.device(cfg.train.device)
    except (RuntimeError, TypeError):
        raise UserError(
            f"train.device {shown(cfg.train.device)} is not a torch device: use cuda, cpu, or "
            f"cuda:N"
        ) from None


def load_lazy_config(config_file: str, overrides: Sequence[str] = ()) -> DictConfig:
    """The config of a run: a recipe (a path or a shipped name, see
    :func:`resolve_lazy_config_file`), then ``key=value`` overrides (:func:`apply_overrides`);
    on the CPU, SyncBN becomes naiveSyncBN (:func:`lambda_det.config.adapt_norms_to_device`).

    Raises:
        FileNotFoundError: no such recipe.
        ValueError: a yaml config, a recipe that does not load or lacks a section, a bad override.
    """
    path = resolve_lazy_config_file(config_file)
    try:
        cfg = LazyConfig.load(path)
    except (SyntaxError, ImportError, NameError, AttributeError) as error:
        cause = error.__cause__ or error
        raise UserError(
            f"LazyConfig {path} does not load: {type(cause).__name__}: "
            f"{' '.join(str(cause).split())}"
        ) from error
    apply_overrides(cfg, overrides)
    _check_recipe(cfg, path)
    changed = adapt_norms_to_device(cfg)
    if changed:
        logger.info("train.device is cpu: SyncBN -> naiveSyncBN for %s", ", ".join(changed))
    return cfg


# Detectron2's own, for the .py recipes (LazyConfig.load may be patched with the function below).
_detectron2_lazy_config_load = LazyConfig.load


def load_lazy_config_file(filename: str, keys=None):
    """Detectron2's ``LazyConfig.load(filename, keys)``, but a ``.yaml``/``.yml`` config is read
    with yaml's safe loader (detectron2 reads it with ``yaml.unsafe_load``, which runs
    ``!!python/...`` tags); a ``.py`` recipe is Python and runs as detectron2 runs it.

    Raises:
        MissingFileError: no such local file.
        ConfigFileError: a yaml config with a tag (or a yaml syntax error); names the file.
    """
    if "://" not in filename and not os.path.isfile(filename):
        raise MissingFileError(
            f"LazyConfig {filename!r} does not exist: pass the path of a .py recipe or of a "
            f"saved .yaml config"
        )
    if os.path.splitext(filename)[1] not in (".yaml", ".yml"):
        return _detectron2_lazy_config_load(filename, keys)
    with PathManager.open(filename) as f:
        cfg = OmegaConf.create(
            _load_plain_yaml(f, f"LazyConfig {filename}"), flags={"allow_objects": True}
        )
    if keys is None:
        return cfg
    return cfg[keys] if isinstance(keys, str) else tuple(cfg[key] for key in keys)
