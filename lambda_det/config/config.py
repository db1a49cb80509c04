"""Config: lambda_det's run keys (:func:`add_lambda_det_config`) and the one merge of a config
file and overrides (:func:`merge_config`) under :func:`lambda_det.run_config.load_config`, which
training, evaluation, export and the demo share. Nothing here knows the model or the data: the
backbone's keys are :func:`lambda_det.modeling.add_lambda_resnet_config`'s, and loading a config
registers no dataset.

Config files run no code: yaml is read with yaml's safe loader only (detectron2's
``merge_from_file`` falls back to ``yaml.unsafe_load``, which runs ``!!python/...`` tags). The one
tag detectron2's own configs use, ``!!python/object/apply:eval [EXPRESSION]`` (RetinaNet's anchor
sizes), is evaluated by :func:`lambda_det.config.expressions.evaluate_expression` (arithmetic,
lists and comprehensions; no other names or calls). A file with any other tag, that is not a
yaml mapping, or whose ``_BASE_`` chain is missing a file or loops, is a :class:`ConfigFileError`
that names the file (:func:`check_config_file`).
"""

import difflib
import logging
import os
import re
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import yaml

from lambda_det.compat import import_detectron2
from lambda_det.utils import run_defaults
from lambda_det.utils.errors import MissingFileError, UserError
from lambda_det.utils.text import not_text

import_detectron2()  # quietly, and with a helpful error when it is missing

from detectron2.config import CfgNode as CN
from detectron2.utils.file_io import PathManager
from fvcore.common.config import BASE_KEY

from lambda_det.config.expressions import (
    MAX_INTEGER_DIGITS,
    ExpressionError,
    evaluate_expression,
    integer_digits,
)

__all__ = [
    "add_lambda_det_config",
    "merge_config",
    "prepare_merged_config",
    "resolve_config_file",
    "adapt_norms_to_device",
    "check_config_file",
    "CfgNode",
    "ConfigFileError",
    "config_keys",
    "did_you_mean",
    "flatten_config",
    "read_config_dump",
]

logger = logging.getLogger(__name__)


def add_lambda_det_config(cfg: CN) -> CN:
    """Add lambda_det's run keys to ``cfg`` in place (``INPUT.LSJ``, ``DATALOADER.DETERMINISTIC``,
    ``DATALOADER.CHECK_IMAGES``, ``DATASETS.COCO_INSTANCES``, ``SOLVER.LOG_PERIOD``,
    ``SOLVER.AMP.DTYPE``; docs/config.md lists them); returns ``cfg``. The backbone's keys,
    ``MODEL.LAMBDA_RESNET``, are the model's: ``lambda_det.modeling.add_lambda_resnet_config``.

    Idempotent: a node that is already there is left as it is.
    """
    if "LSJ" not in cfg.INPUT:
        cfg.INPUT.LSJ = _lsj_node()
    # Every iteration a function of (SEED, iteration): bit-exact --resume on the CPU, and the
    # same global batches for any number of processes (lambda_det.engine.deterministic; uniform
    # sampling: SAMPLER_TRAIN and ASPECT_RATIO_GROUPING do not apply).
    if "DETERMINISTIC" not in cfg.DATALOADER:
        cfg.DATALOADER.DETERMINISTIC = False
    # How often the metric writers (metrics.json, the console) run; detectron2 fixes it at 20.
    if "LOG_PERIOD" not in cfg.SOLVER:
        cfg.SOLVER.LOG_PERIOD = run_defaults.LOG_PERIOD
    # The autocast dtype of SOLVER.AMP.ENABLED: "float16" (with loss scaling, detectron2's AMP)
    # or "bfloat16" (no scaling needed; A100/H100 GPUs and CPUs).
    if "DTYPE" not in cfg.SOLVER.AMP:
        cfg.SOLVER.AMP.DTYPE = run_defaults.AMP_DTYPE
    # What tools/train_net.py reads of every image before training (lambda_det.data.checks):
    # "header" (readable, size, not truncated), "full" (decoded as training will), "none".
    if "CHECK_IMAGES" not in cfg.DATALOADER:
        cfg.DATALOADER.CHECK_IMAGES = run_defaults.CHECK_IMAGES
    # COCO-format datasets to register, [name, json_file, image_root] each (lambda_det.data.coco).
    if "COCO_INSTANCES" not in cfg.DATASETS:
        cfg.DATASETS.COCO_INSTANCES = []
    return cfg


def _lsj_node() -> CN:
    # Large-scale jitter (paper F.3): train on random [MIN_SCALE, MAX_SCALE] x IMAGE_SIZE resizes,
    # cropped or padded to IMAGE_SIZE^2. Training only: the test size is detectron2's
    # INPUT.MIN_SIZE_TEST / MAX_SIZE_TEST (1024 / 1024 in the paper configs).
    lsj = CN()
    lsj.ENABLED = False
    lsj.IMAGE_SIZE = 1024
    lsj.MIN_SCALE = 0.1
    lsj.MAX_SCALE = 2.0
    return lsj


class ConfigFileError(UserError):
    """A config file (or saved config) that is not a plain yaml mapping, or whose ``_BASE_``
    chain loops; the message names the file."""


# Far above what any config needs (detectron2's full config is ~400 values, 5 levels deep; its
# model zoo's _BASE_ chains are 2 files), far below what takes a second to read or merge, or
# what the recursive code that reads a config (yacs, OmegaConf) can follow.
MAX_YAML_DEPTH = 32  # levels of mappings and lists in one file, through its aliases too
MAX_YAML_VALUES = 50_000  # values of one file with each alias expanded (a "billion laughs")
MAX_BASE_DEPTH = 16  # files in one _BASE_ chain, the config itself included
MAX_BASE_FILES = 32  # files one config reads, itself and its bases (a base named twice: twice)


class _PlainYamlLoader(yaml.SafeLoader):
    """yaml's safe loader: plain values only (mappings, lists, strings, numbers, booleans),
    within :data:`MAX_YAML_DEPTH` and :data:`MAX_YAML_VALUES`, and integers within
    :data:`~lambda_det.config.expressions.MAX_INTEGER_DIGITS` digits."""

    def __init__(self, stream):
        super().__init__(stream)
        self.nesting = 0  # of the node being composed; composing recurses once a level

    def compose_node(self, parent, index):
        self.nesting += 1
        try:
            if self.nesting > MAX_YAML_DEPTH:
                raise _TooLarge(self.peek_event(), _too_deep())
            return super().compose_node(parent, index)
        finally:
            self.nesting -= 1

    def compose_document(self):
        node = super().compose_document()
        _check_expanded_size(node)
        return node


class _RefusedTag(yaml.YAMLError):
    """A tag in a yaml file: its name as written and its line."""

    def __init__(self, node: yaml.Node):
        super().__init__(node.tag)
        # As written in the file: "!!python/..." rather than "tag:yaml.org,2002:python/...".
        self.tag = re.sub(r"^tag:yaml\.org,2002:", "!!", node.tag)
        self.line = node.start_mark.line + 1


class _RefusedExpression(yaml.YAMLError):
    """An ``!!python/object/apply:eval`` expression that is not plain arithmetic."""

    def __init__(self, node: yaml.Node, reason: str):
        super().__init__(reason)
        self.reason = reason
        self.line = node.start_mark.line + 1


class _TooLarge(yaml.YAMLError):
    """A yaml document nested too deeply, or too large with its aliases expanded."""

    def __init__(self, event_or_node, reason: str):
        super().__init__(reason)
        self.reason = reason
        self.line = event_or_node.start_mark.line + 1


def _too_deep() -> str:
    return (
        f"mappings and lists nest more than {MAX_YAML_DEPTH} levels deep (its aliases "
        f"included): a config nests a few levels"
    )


def _check_expanded_size(root: Optional[yaml.Node]) -> None:
    """Refuse a document deeper than :data:`MAX_YAML_DEPTH` or of more values than
    :data:`MAX_YAML_VALUES` once each alias is expanded (as the config's readers expand it),
    counted on yaml's nodes: an alias is the node it names, measured once."""
    measured: Dict[int, Tuple[int, int]] = {}  # id(node) -> (values, levels below it)
    open_nodes = set()  # being measured: an alias to one of them is a cycle

    def measure(node: yaml.Node, depth: int) -> Tuple[int, int]:
        known = measured.get(id(node))
        if known is None:
            if id(node) in open_nodes:
                raise _TooLarge(
                    node, "an alias here names a value that holds it: it nests without end"
                )
            if depth > MAX_YAML_DEPTH:
                raise _TooLarge(node, _too_deep())
            open_nodes.add(id(node))
            children = _children(node)
            sizes = [measure(child, depth + 1) for child in children]
            open_nodes.discard(id(node))
            known = (
                1 + sum(values for values, _ in sizes),
                max((1 + below for _, below in sizes), default=0),
            )
            measured[id(node)] = known
        if depth + known[1] > MAX_YAML_DEPTH:
            raise _TooLarge(node, _too_deep())
        if known[0] > MAX_YAML_VALUES:
            raise _TooLarge(
                node,
                f"the value here holds {known[0]} values, each yaml alias (*name) counted as "
                f"all the values it names, more than {MAX_YAML_VALUES}: a config holds a few "
                f"hundred",
            )
        return known

    if root is not None:
        measure(root, 1)


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return []


def _refuse_tag(loader, node):
    raise _RefusedTag(node)


def _construct_integer(loader, node):
    """yaml's integer, read only when its text is short enough to hold at most
    MAX_INTEGER_DIGITS digits: ``int`` of a long text is quadratic (sexagesimal, ``1:2:...``)
    or a ValueError (decimal, past 4,300 digits)."""
    text = loader.construct_scalar(node)
    if len(text) > 2 * MAX_INTEGER_DIGITS:  # signs, underscores, 0x: a number's text is longer
        raise _TooLarge(node, _too_many_digits(f"{len(text)} characters"))
    value = loader.construct_yaml_int(node)
    if integer_digits(value) > MAX_INTEGER_DIGITS:
        raise _TooLarge(node, _too_many_digits(f"{integer_digits(value)} digits"))
    return value


def _too_many_digits(size: str) -> str:
    return (
        f"the integer is too large ({size}): a config's integers have at most "
        f"{MAX_INTEGER_DIGITS} digits"
    )


def _evaluate_expression_tag(loader, node):
    """``!!python/object/apply:eval ["EXPRESSION"]``, as detectron2's configs write it."""
    if not (
        isinstance(node, yaml.SequenceNode)
        and len(node.value) == 1
        and isinstance(node.value[0], yaml.ScalarNode)
    ):
        raise _RefusedTag(node)
    try:
        return evaluate_expression(loader.construct_scalar(node.value[0]))
    except ExpressionError as error:
        raise _RefusedExpression(node, str(error)) from None


# A tag the safe loader has no constructor for: refused, with its name and line.
_PlainYamlLoader.add_constructor(None, _refuse_tag)
_PlainYamlLoader.add_constructor(
    "tag:yaml.org,2002:python/object/apply:eval", _evaluate_expression_tag
)
_PlainYamlLoader.add_constructor("tag:yaml.org,2002:int", _construct_integer)


def _load_plain_yaml(stream, where: str, loader: type = _PlainYamlLoader):
    """The yaml document of ``stream`` (text or a file) with the safe loader (or ``loader``, a
    subclass of it); a tag or a yaml syntax error is a :class:`ConfigFileError` that starts
    with ``where``."""
    try:
        return yaml.load(stream, Loader=loader)
    except _RefusedTag as refused:
        raise ConfigFileError(
            f"{where}, line {refused.line}: the yaml tag {refused.tag} is refused (a config "
            f"holds plain values: mappings, lists, strings, numbers; a tag could run code): "
            f"remove the tag"
        ) from None
    except _RefusedExpression as refused:
        raise ConfigFileError(
            f"{where}, line {refused.line}: !!python/object/apply:eval: {refused.reason}: "
            f"write the value itself"
        ) from None
    except _TooLarge as refused:
        raise ConfigFileError(f"{where}, line {refused.line}: {refused.reason}") from None
    except yaml.YAMLError as error:
        raise ConfigFileError(f"{where}: {' '.join(str(error).split())}") from None
    except UnicodeDecodeError as error:  # a binary file, read as text
        raise ConfigFileError(str(not_text(where, error, "pass a yaml config"))) from None


def _base_path(base: str, config_file: str) -> str:
    """Where fvcore's ``load_yaml_with_base`` looks for ``_BASE_: base`` of ``config_file``."""
    if base.startswith("~"):
        base = os.path.expanduser(base)
    if not base.startswith(("/", "https://", "http://")):  # relative to the file naming it
        base = os.path.join(os.path.dirname(config_file), base)
    return base


def check_config_file(path: str) -> None:
    """Check a yaml config and its ``_BASE_`` chain before detectron2 merges it: every file
    exists, is a yaml mapping of plain values (no tags: they would run code; detectron2's
    arithmetic tag is evaluated, see the module docstring), names its bases as a path or a list
    of paths, and no chain comes back to a file it passed.

    Raises:
        FileNotFoundError: the file or a ``_BASE_`` does not exist.
        ConfigFileError: anything else above; the message names the file.
    """
    load_yaml_with_base(path)


def load_yaml_with_base(path: str) -> dict:
    """The yaml config ``path`` merged over its ``_BASE_`` chain, as fvcore's
    ``CfgNode.load_yaml_with_base`` merges it, after the checks of :func:`check_config_file`."""
    return _load_config_chain(path, (), [])


def _merge_into(values: dict, base: dict, where: str) -> None:
    """fvcore's merge of a file over its base: mappings merge key by key, other values replace."""
    for key, value in values.items():
        if isinstance(value, dict) and key in base:
            if not isinstance(base[key], dict):
                raise ConfigFileError(
                    f"{where}: {key} is a mapping, but its _BASE_ gives it "
                    f"{base[key]!r}: make both mappings or neither"
                )
            _merge_into(value, base[key], where)
        else:
            base[key] = value


def _load_config_chain(path: str, chain: Tuple[str, ...], read: List[str]) -> dict:
    """:func:`load_yaml_with_base` of ``path``, reached through the ``_BASE_`` keys of
    ``chain``; ``read``: the files the config has read so far (``path`` is added)."""
    where = f"config file {path}" + (f" (a _BASE_ of {chain[-1]})" if chain else "")
    if os.path.realpath(path) in map(os.path.realpath, chain):
        loop = " -> ".join([*chain, path])
        raise ConfigFileError(
            f"config file {chain[0]}: its _BASE_ chain {loop} is a loop: "
            f"remove the _BASE_ that closes it"
        )
    if len(chain) >= MAX_BASE_DEPTH:
        raise ConfigFileError(
            f"config file {chain[0]}: its _BASE_ chain is more than {MAX_BASE_DEPTH} files "
            f"deep (at {path}): a chain is a few files; name a base nearer the top"
        )
    if len(read) >= MAX_BASE_FILES:
        raise ConfigFileError(
            f"config file {read[0]}: it and its _BASE_ files are more than {MAX_BASE_FILES} "
            f"files to read (at {path}; a base named twice is read twice): name fewer bases"
        )
    read.append(path)
    try:
        with PathManager.open(path, "r") as f:  # as detectron2's CfgNode opens a config
            data = _load_plain_yaml(f, where)
    except OSError:  # missing, a folder, unreadable
        raise MissingFileError(
            f"{where} does not exist or is not a readable file"
            + (" (a relative _BASE_ is relative to the file naming it)" if chain else "")
        ) from None
    if data is None:
        raise ConfigFileError(f"{where} is empty: a config is a yaml mapping of KEY: value")
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a single {type(data).__name__} value"
        raise ConfigFileError(f"{where} holds {kind}, not a yaml mapping of KEY: value")
    bases = data.get(BASE_KEY, [])
    bases = [bases] if isinstance(bases, str) else bases
    if not (isinstance(bases, list) and all(isinstance(base, str) for base in bases)):
        raise ConfigFileError(
            f"{where}: {BASE_KEY} is {data[BASE_KEY]!r}: give a config path or a list of them"
        )
    if BASE_KEY not in data:
        return data
    merged: dict = {}
    for base in bases:
        base_values = _load_config_chain(_base_path(base, path), (*chain, path), read)
        _merge_into(base_values, merged, where)
    values = {key: value for key, value in data.items() if key != BASE_KEY}
    _merge_into(values, merged, where)
    return merged


class CfgNode(CN):
    """Detectron2's CfgNode, whose ``merge_from_file`` runs no code from the file: the file and
    its ``_BASE_`` chain are checked and read by :func:`load_yaml_with_base` (detectron2's
    default, ``allow_unsafe=True``, falls back to ``yaml.unsafe_load``); detectron2 then merges
    the values as usual (version upgrade included)."""

    def merge_from_file(self, cfg_filename: str, allow_unsafe: bool = False) -> None:
        # allow_unsafe is accepted for detectron2's signature and ignored: nothing is unsafe here.
        if not os.path.isfile(cfg_filename):  # detectron2 would assert; say it as the chain does
            load_yaml_with_base(cfg_filename)
        super().merge_from_file(cfg_filename, allow_unsafe=False)

    @classmethod
    def load_yaml_with_base(cls, filename: str, allow_unsafe: bool = False) -> dict:
        return load_yaml_with_base(filename)


def flatten_config(node, prefix: str = "") -> dict:
    """A nested config (dicts) as ``{"A.B.C": value}``."""
    if not isinstance(node, dict):
        return {prefix: node}
    flat = {}
    for key, value in node.items():
        flat.update(flatten_config(value, f"{prefix}.{key}" if prefix else key))
    return flat


def read_config_dump(text: str, where: str) -> dict:
    """A config dump (yaml text) as a dict, read with the safe loader."""
    data = _load_plain_yaml(text, where)
    if not isinstance(data, dict):
        raise ConfigFileError(f"{where} is not a config: it holds no yaml mapping of KEY: value")
    return data


def adapt_norms_to_device(cfg) -> List[str]:
    """On the CPU, "SyncBN" (torch's SyncBatchNorm needs CUDA to synchronise) becomes detectron2's
    "naiveSyncBN", which synchronises through torch.distributed (gloo on the CPU) and is plain BN
    in a single process: every ``*NORM`` key under ``MODEL`` of a yaml config with MODEL.DEVICE
    cpu, every ``*norm`` argument under ``model`` of a LazyConfig recipe with train.device cpu.
    In place; returns the keys it changed."""
    lazy = "train" in cfg and "model" in cfg
    device = cfg.train.device if lazy else cfg.MODEL.DEVICE
    if device != "cpu":
        return []
    model, path = (cfg.model, "model") if lazy else (cfg.MODEL, "MODEL")
    changed = []
    for node, key, dotted in list(_sync_bn_norms(model)):
        node[key] = "naiveSyncBN"
        changed.append(f"{path}.{dotted}")
    return changed


def _sync_bn_norms(node, path: str = "") -> Iterator[Tuple[object, str, str]]:
    """(parent, key, dotted key) of every norm setting "SyncBN" in a nested config (a CfgNode or an
    OmegaConf node: mappings and lists)."""
    if hasattr(node, "items"):
        items = node.items()
    elif isinstance(node, Sequence) and not isinstance(node, str):  # lists, OmegaConf's too
        items = enumerate(node)
    else:
        return
    for key, value in items:
        dotted = f"{path}{key}"
        if isinstance(key, str) and key.lower().endswith("norm") and value == "SyncBN":
            yield node, key, dotted
        else:
            yield from _sync_bn_norms(value, dotted + ".")


def config_keys(node, prefix: str = "") -> Iterator[str]:
    """Every key of a nested config (a CfgNode, a dict), dotted: nodes and values."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{prefix}{key}"
            yield from config_keys(value, f"{prefix}{key}.")


def did_you_mean(key: str, keys: Sequence[str]) -> str:
    """ "did you mean X? " for the one of ``keys`` closest to a misspelt ``key``, else "": the
    hint of an unknown key, in yaml configs and LazyConfig recipes alike."""
    close = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.8)
    return f"did you mean {close[0]}? " if close else ""


def _config_error(error: Exception, where: str, cfg: CN, keys: Iterable[str]) -> ValueError:
    """yacs' and detectron2's config errors (KeyError, AssertionError, ...) as one-line
    ValueErrors that say where the bad key came from; when one of ``keys`` (those the file or
    the overrides set) is not ``cfg``'s, that key and the closest of ``cfg``'s."""
    known = set(config_keys(cfg))
    for key in keys:
        if key not in known and not cfg.key_is_renamed(key) and not cfg.key_is_deprecated(key):
            return UserError(
                f"config key {key} ({where}) does not exist: "
                f"{did_you_mean(key, list(known))}check its spelling "
                f"(lambda_det's own keys are listed in docs/config.md)"
            )
    message = str(error.args[0]) if error.args else str(error)
    return UserError(f"{where}: {' '.join(message.split())}")


def resolve_config_file(name: str) -> str:
    """``name`` itself when it is a file, else the shipped config of that name
    (:func:`lambda_det.config.shipped.get_config_file`)."""
    from lambda_det.config.shipped import get_config_file

    return name if os.path.isfile(name) else get_config_file(name)


def merge_config(cfg: CN, config_file: Optional[str] = None, opts: Sequence[str] = ()) -> CN:
    """Merge into ``cfg`` (a :class:`CfgNode` of defaults, e.g.
    :func:`lambda_det.run_config.get_cfg`) the file, then ``KEY VALUE`` overrides; on the CPU,
    SyncBN becomes naiveSyncBN (:func:`prepare_merged_config`). In place; returns ``cfg``.
    Registers no dataset: the tools register ``DATASETS.COCO_INSTANCES`` before reading data
    (:func:`lambda_det.data.register_datasets`).

    Args:
        config_file: a path, or the name of a shipped config (see
            :func:`lambda_det.model_zoo.get_config_file`); None for the defaults alone.
        opts: overrides, as on detectron2's command line, e.g. ``["SOLVER.MAX_ITER", "10"]``.

    Raises:
        FileNotFoundError: ``config_file`` is neither a file nor a shipped config, or a
            ``_BASE_`` it names does not exist.
        ConfigFileError: a file of the ``_BASE_`` chain holds a yaml tag (it would run code),
            is empty or no mapping, or the chain loops (:func:`check_config_file`).
        ValueError: an unknown key, a value of the wrong type, a malformed file or overrides.
    """
    if config_file:
        path = resolve_config_file(config_file)
        if path.endswith(".py"):
            raise UserError(
                f"{path} is a LazyConfig recipe: train it with "
                f"tools/lazyconfig_train_net.py, or pass a yaml config"
            )
        try:
            cfg.merge_from_file(path)
        except (ConfigFileError, MissingFileError):
            raise  # names the file already
        except (KeyError, ValueError, AssertionError, yaml.YAMLError) as error:
            keys = config_keys(load_yaml_with_base(path))
            raise _config_error(error, f"in config file {path}", cfg, keys) from None
    opts = list(opts)
    if len(opts) % 2:
        raise UserError(f"config overrides must be KEY VALUE pairs, got an odd number: {opts}")
    try:
        cfg.merge_from_list(opts)
    except (KeyError, ValueError, AssertionError) as error:
        raise _config_error(error, "in the command-line overrides", cfg, opts[0::2]) from None
    prepare_merged_config(cfg)
    return cfg


def prepare_merged_config(cfg: CN) -> None:
    """What :func:`merge_config` does once the file and overrides are merged: on the CPU, makes
    SyncBN naiveSyncBN (:func:`adapt_norms_to_device`), and logs it."""
    changed = adapt_norms_to_device(cfg)
    if changed:
        logger.info("MODEL.DEVICE is cpu: SyncBN -> naiveSyncBN for %s", ", ".join(changed))
