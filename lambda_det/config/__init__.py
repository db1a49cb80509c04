"""Both config systems, as in detectron2's ``config/``: yaml configs (:mod:`.config`: lambda_det's
run keys, safe loading of a ``_BASE_`` chain, overrides) and LazyConfig ``.py`` recipes
(:mod:`.lazy`); :mod:`.shipped` finds the shipped configs by name. It knows neither the model
nor the data: :func:`lambda_det.run_config.load_config` adds the backbone's keys
(:func:`lambda_det.modeling.add_lambda_resnet_config`), and loading a config registers no
dataset."""

from lambda_det.config.config import (
    CfgNode,
    ConfigFileError,
    adapt_norms_to_device,
    add_lambda_det_config,
    check_config_file,
    config_keys,
    did_you_mean,
    flatten_config,
    merge_config,
    prepare_merged_config,
    read_config_dump,
    resolve_config_file,
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
