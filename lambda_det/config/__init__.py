"""Both config systems, as in detectron2's ``config/``: yaml configs (:mod:`.config`: lambda_det's
defaults, safe loading of a ``_BASE_`` chain, overrides) and LazyConfig ``.py`` recipes
(:mod:`.lazy`); :mod:`.shipped` finds the shipped configs by name."""
from lambda_det.config.config import (
    CfgNode, ConfigFileError, adapt_norms_to_device, add_lambda_det_config,
    add_lambda_resnet_config, check_config_file, config_differences, config_keys, did_you_mean,
    get_cfg, load_config, prepare_merged_config, resolve_config_file)

__all__ = ["add_lambda_det_config", "add_lambda_resnet_config", "get_cfg", "load_config",
           "resolve_config_file", "prepare_merged_config", "adapt_norms_to_device",
           "config_differences", "check_config_file", "CfgNode", "ConfigFileError",
           "config_keys", "did_you_mean"]
