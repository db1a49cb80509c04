"""The yaml config of a run, as a detectron2 project's ``setup()`` makes it: detectron2's
defaults, lambda_det's run keys (:func:`lambda_det.config.add_lambda_det_config`) and the
backbone's (:func:`lambda_det.modeling.add_lambda_resnet_config`), then the file and the
overrides. It sits above :mod:`lambda_det.config` and :mod:`lambda_det.modeling`, which know
nothing of each other. Loading a config registers no dataset: the tools register what a run
reads (:func:`lambda_det.data.register_datasets`) before building its loaders.
"""

from typing import List, Optional, Sequence

import yaml

from lambda_det.compat import import_detectron2

import_detectron2()  # quietly, and with a helpful error when it is missing

from detectron2.config import get_cfg as get_detectron2_cfg

from lambda_det.config import (
    CfgNode,
    add_lambda_det_config,
    flatten_config,
    merge_config,
    read_config_dump,
)
from lambda_det.modeling.config import (
    RENAMED_KEYS,
    add_lambda_resnet_config,
    add_timm_backbone_config,
    register_renamed_keys,
)

__all__ = ["get_cfg", "load_config", "config_differences"]


def get_cfg() -> CfgNode:
    """Detectron2's default config plus lambda_det's keys (run and backbone), as a
    :class:`lambda_det.config.CfgNode` (safe ``merge_from_file``)."""
    cfg = add_lambda_resnet_config(add_lambda_det_config(get_detectron2_cfg()))
    cfg = CfgNode(add_timm_backbone_config(cfg))
    register_renamed_keys(cfg)  # the conversion keeps the keys, not yacs' list of renamed ones
    return cfg


def load_config(
    config_file: Optional[str] = None, opts: Sequence[str] = (), *, freeze: bool = True
) -> CfgNode:
    """The config of a run: lambda_det's defaults (:func:`get_cfg`), then the file, then
    ``KEY VALUE`` overrides; on the CPU, SyncBN becomes naiveSyncBN
    (:func:`lambda_det.config.merge_config`, which names what it raises). Registers no dataset.

    Args:
        config_file: a path, or the name of a shipped config (see
            :func:`lambda_det.model_zoo.get_config_file`); None for the defaults alone.
        opts: overrides, as on detectron2's command line, e.g. ``["SOLVER.MAX_ITER", "10"]``.
        freeze: freeze the returned config.
    """
    cfg = merge_config(get_cfg(), config_file, opts)
    if freeze:
        cfg.freeze()
    return cfg


def config_differences(saved: str, wanted: str, saved_in: str = "the saved config") -> List[str]:
    """``KEY: saved -> wanted`` for every key whose value differs between two config dumps
    (yaml text), sorted by key. ``saved_in`` names where ``saved`` was read from, for the
    :class:`lambda_det.config.ConfigFileError` of a dump that is not plain yaml.

    A key that a dump lacks counts as its default: a run saved before lambda_det added the key
    ran with the default's behaviour, so it is the same run under a newer lambda_det. A key of
    ``saved`` that :data:`lambda_det.modeling.config.RENAMED_KEYS` lists counts as the key it
    became.
    """
    defaults = flatten_config(yaml.safe_load(get_cfg().dump()))
    saved_keys = flatten_config(read_config_dump(saved, saved_in)).items()
    old = {**defaults, **{RENAMED_KEYS.get(key, key): value for key, value in saved_keys}}
    new = {**defaults, **flatten_config(read_config_dump(wanted, "the wanted config"))}
    return [
        f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]
