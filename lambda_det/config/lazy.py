"""LazyConfig recipes (the .py configs of configs/LazyConfigs/): loading, checked command-line
overrides, the CPU norm swap and the linear scaling to a world size that the yaml configs get
from lambda_det.config and detectron2's ``DefaultTrainer.auto_scale_workers``.

A recipe defines ``model``, ``dataloader`` (``train``, ``test``, ``evaluator``), ``optimizer``,
``lr_multiplier`` and ``train`` (tools/lazyconfig_train_net.py reads them).
"""

import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import pydoc
import re
from typing import Optional, Sequence, Tuple

import torch
import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lambda_det.compat import import_detectron2

import_detectron2()  # quietly, and with a helpful error when it is missing

from detectron2.config import LazyConfig
from detectron2.utils.file_io import PathManager
from detectron2.utils.registry import locate

from lambda_det.config import adapt_norms_to_device, config_keys, did_you_mean
from lambda_det.config.config import (
    ConfigFileError,
    _load_plain_yaml,
    _PlainYamlLoader,
    _RefusedTag,
)
from lambda_det.utils.errors import MissingFileError, UserError
from lambda_det.utils.setting import shown

__all__ = [
    "load_lazy_config",
    "resolve_lazy_config_file",
    "apply_overrides",
    "scale_to_world_size",
    "load_lazy_config_file",
    "check_lazy_targets",
    "is_trusted_callable",
    "UntrustedConfigError",
    "TRUSTED_PACKAGES",
    "TRUSTED_FUNCTIONS",
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


# ---- LazyConfig yaml files: data, whose _target_s name only what a recipe builds ----

# The packages whose classes a LazyConfig yaml may name, as a _target_ or with the tags that
# LazyConfig.save writes for a class (!!python/name) or an object (ShapeSpec:
# !!python/object/new, or !!python/object for a dataclass).
TRUSTED_PACKAGES = ("detectron2", "lambda_det", "torch.nn", "torch.optim", "fvcore")
# The functions that detectron2's own recipes (its model_zoo/configs, in 0.6 and in main at
# 02b5c4e) and lambda_det's name as a _target_. Not every function of those packages: some run
# code or write files (detectron2's LazyConfig.load runs a .py file; lambda_det's atomic_write
# writes any file).
TRUSTED_FUNCTIONS = (
    "detectron2.data.build_detection_test_loader",
    "detectron2.data.build_detection_train_loader",
    "detectron2.data.get_detection_dataset_dicts",
    "detectron2.data.samplers.RepeatFactorTrainingSampler.repeat_factors_from_category_frequency",
    "detectron2.modeling.ResNet.make_default_stages",
    "detectron2.modeling.ResNet.make_stage",
    "detectron2.solver.get_default_optimizer_params",
    "lambda_det.data.build_lsj_augmentations",
    "lambda_det.data.checks.load_checked_dataset_dicts",
    "lambda_det.solver.warmup_multistep",
)
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_PYTHON_TAG = "tag:yaml.org,2002:python/"
TRUST_HINT = (
    "if you trust the file (what it names runs as code), pass --trust-config FILE to "
    "python -m lambda_det.d2tool before SCRIPT (in Python: load_lazy_config_file('FILE', "
    "trusted=True))"
)


class UntrustedConfigError(ConfigFileError):
    """A LazyConfig yaml that names a callable outside the allow-list (:data:`TRUSTED_PACKAGES`,
    :data:`TRUSTED_FUNCTIONS`): loading and instantiating it would run that callable."""


def _in_trusted_package(name: str) -> bool:
    return any(name == package or name.startswith(package + ".") for package in TRUSTED_PACKAGES)


@functools.lru_cache(maxsize=None)
def _trusted_functions() -> tuple:
    """The functions of :data:`TRUSTED_FUNCTIONS` that this detectron2 and lambda_det have."""
    found = []
    for name in TRUSTED_FUNCTIONS:
        with contextlib.suppress(ImportError, pydoc.ErrorDuringImport):
            found.append(locate(name))
    return tuple(found)


def is_trusted_callable(obj) -> bool:
    """Whether a LazyConfig yaml may name ``obj``: a class of :data:`TRUSTED_PACKAGES`, or one of
    :data:`TRUSTED_FUNCTIONS`."""
    if inspect.isclass(obj):
        return _in_trusted_package(str(getattr(obj, "__module__", "")))
    return any(obj is function for function in _trusted_functions())


# Why a name is refused: the end of the error, after "... names NAME, which".
_UNTRUSTED = "a LazyConfig yaml may not name"
_NOT_A_NAME = (
    "is no importable name (LazyConfig.save writes a lambda or a function of the recipe itself "
    "so, and nothing loads it back): load the .py recipe instead"
)


def _find_trusted(name: str) -> Tuple[Optional[object], Optional[str]]:
    """(the trusted callable that the dotted ``name`` names, found as detectron2's
    ``instantiate`` finds it, None), or (None, why ``name`` is refused). Only a module of
    :data:`TRUSTED_PACKAGES` is imported."""
    if not _DOTTED_NAME.fullmatch(name):
        return None, _NOT_A_NAME
    if not _in_trusted_package(name):
        return None, _UNTRUSTED
    try:
        obj = locate(name)
    except (ImportError, pydoc.ErrorDuringImport) as error:
        return None, f"does not exist ({type(error).__name__}): check its spelling"
    return (obj, None) if is_trusted_callable(obj) else (None, _UNTRUSTED)


def _refused(where: str, subject: str, named: str, why: str, filename: str) -> ConfigFileError:
    """The error for ``subject`` (a key, a tag) at ``where`` that names ``named``."""
    if why != _UNTRUSTED:
        return ConfigFileError(f"{where}: {subject} names {named}, which {why}")
    return UntrustedConfigError(
        f"{where}: {subject} names {named}, which a LazyConfig yaml may not name (a yaml file "
        f"is data: it may name the classes of {', '.join(TRUSTED_PACKAGES)} and the functions "
        f"detectron2's recipes call); {TRUST_HINT.replace('FILE', filename)}"
    )


def _described(target) -> str:
    """How an error names a ``_target_``: a name as written, an object by its full name."""
    if isinstance(target, str):
        return repr(target)
    if isinstance(target, (DictConfig, ListConfig)):
        return "a mapping" if isinstance(target, DictConfig) else "a list"
    name = getattr(target, "__qualname__", None)
    if name is not None:
        return f"{getattr(target, '__module__', '?')}.{name}"
    return f"a {type(target).__name__}"


def check_lazy_targets(cfg: DictConfig, filename: str) -> None:
    """Refuse a LazyConfig that names a callable outside the allow-list as a ``_target_``: at any
    depth, in lists, and where an interpolation leads (``${oc.create:...}`` makes a node).
    A ``_target_`` may be a dotted name or an object; a name outside :data:`TRUSTED_PACKAGES` is
    refused without importing anything. A value that does not resolve (``???``, a dangling
    interpolation) is skipped: detectron2 cannot build from it either.

    Raises:
        UntrustedConfigError: naming ``filename``, the key and the target.
        ConfigFileError: a target that names nothing (a misspelt name, a saved lambda).
    """
    stack = [("", cfg)]
    # An interpolation leads to a node itself: each node is walked once. Held, not only its id:
    # a node that ${oc.create:...} makes anew would otherwise free an id for the next one.
    seen = {}
    while stack:
        path, node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        for key in keys:
            where = f"{path}[{key}]" if isinstance(node, ListConfig) else f"{path}.{key}"
            where = where.lstrip(".")
            try:
                value = node[key]
            except OmegaConfBaseException:
                continue
            if key == "_target_":
                if isinstance(value, str):
                    why = _find_trusted(value)[1]
                else:
                    why = None if callable(value) and is_trusted_callable(value) else _UNTRUSTED
                if why is not None:
                    named = _described(value)
                    raise _refused(f"LazyConfig {filename}", where, named, why, filename)
            if isinstance(value, (DictConfig, ListConfig)):
                stack.append((where, value))


class _TaggedValueError(Exception):
    """A refused python tag of a LazyConfig yaml: the name it gives (``named``) and why it is
    refused, or (``named`` None) why its value does not build. (No YAMLError: _load_plain_yaml
    words those.)"""

    def __init__(self, node: yaml.Node, named: Optional[str] = None, reason: str = ""):
        super().__init__(node.tag)
        self.tag = f"!!python/{node.tag[len(_PYTHON_TAG) :]}"
        self.line = node.start_mark.line + 1
        self.named = named
        self.reason = reason


def _construct_python_tag(loader: yaml.Loader, suffix: str, node: yaml.Node):
    """A ``!!python/...`` tag as LazyConfig.save writes it, for a trusted callable only:
    ``!!python/name:CLASS ''`` is the class, ``!!python/object/new:CLASS [ARGS]`` a tuple class
    (detectron2 0.6's ShapeSpec) built from ARGS, ``!!python/object:CLASS {FIELDS}`` a
    dataclass (detectron2 main's ShapeSpec) built from FIELDS. Any other tag is refused."""
    kind, _, name = suffix.partition(":")
    if not name:
        raise _RefusedTag(node)
    obj, why = _find_trusted(name)
    if why is not None:
        raise _TaggedValueError(node, named=name, reason=why)
    if kind == "name" and isinstance(node, yaml.ScalarNode):
        return obj
    if kind == "object/new" and isinstance(node, yaml.SequenceNode) and _is_tuple_class(obj):
        values, build = loader.construct_sequence(node, deep=True), lambda: obj(*values)
    elif kind == "object" and isinstance(node, yaml.MappingNode) and _is_dataclass(obj):
        values, build = loader.construct_mapping(node, deep=True), lambda: obj(**values)
    else:
        raise _RefusedTag(node)
    try:
        return build()
    except TypeError as error:  # the wrong fields for the class
        raise _TaggedValueError(node, reason=str(error)) from None


def _is_tuple_class(obj) -> bool:
    return inspect.isclass(obj) and issubclass(obj, tuple)


def _is_dataclass(obj) -> bool:
    return inspect.isclass(obj) and dataclasses.is_dataclass(obj)


class _LazyConfigYamlLoader(_PlainYamlLoader):
    """The plain-yaml loader of configs, plus the python tags of :func:`_construct_python_tag`
    (``!!python/object/apply:eval`` stays the config expression)."""


_LazyConfigYamlLoader.add_multi_constructor(_PYTHON_TAG, _construct_python_tag)

# Detectron2's own, for the .py recipes (LazyConfig.load may be patched with the function below).
_detectron2_lazy_config_load = LazyConfig.load


def load_lazy_config_file(filename: str, keys=None, trusted: bool = False):
    """Detectron2's ``LazyConfig.load(filename, keys)``, but a ``.yaml``/``.yml`` config is data:
    read with yaml's safe loader (detectron2 reads it with ``yaml.unsafe_load``, which runs
    ``!!python/...`` tags), and every ``_target_`` it names must be a trusted callable
    (:func:`check_lazy_targets`; the tags LazyConfig.save writes for trusted classes load, see
    :func:`_construct_python_tag`). A ``.py`` recipe is Python and runs as detectron2 runs it;
    so does a yaml file with ``trusted`` (detectron2's own loading: its tags and targets are
    code).

    Raises:
        MissingFileError: no such local file.
        ConfigFileError: a yaml config with another tag (or a yaml syntax error); names the file.
        UntrustedConfigError: a callable outside the allow-list; names the file, key and name.
    """
    if "://" not in filename and not os.path.isfile(filename):
        raise MissingFileError(
            f"LazyConfig {filename!r} does not exist: pass the path of a .py recipe or of a "
            f"saved .yaml config"
        )
    if trusted or os.path.splitext(filename)[1] not in (".yaml", ".yml"):
        return _detectron2_lazy_config_load(filename, keys)
    where = f"LazyConfig {filename}"
    try:
        with PathManager.open(filename) as f:
            data = _load_plain_yaml(f, where, loader=_LazyConfigYamlLoader)
    except _TaggedValueError as error:
        where = f"{where}, line {error.line}"
        if error.named is not None:
            subject = f"the yaml tag {error.tag}"
            raise _refused(where, subject, error.named, error.reason, filename) from None
        raise ConfigFileError(
            f"{where}: the yaml tag {error.tag} does not build: {error.reason}"
        ) from None
    cfg = OmegaConf.create(data, flags={"allow_objects": True})
    check_lazy_targets(cfg, filename)
    if keys is None:
        return cfg
    return cfg[keys] if isinstance(keys, str) else tuple(cfg[key] for key in keys)
