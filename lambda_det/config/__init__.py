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

# Names that moved to lambda_det.run_config (which joins the config and the model's keys), kept
# here for one release with a DeprecationWarning. Imported by name on first access: this package
# must not import the model (import contract config-below-the-model), and a string import
# registers nothing until a caller asks for one of these names.
_MOVED_TO_RUN_CONFIG = ("get_cfg", "load_config")


def __getattr__(name: str):
    if name in _MOVED_TO_RUN_CONFIG:
        import importlib
        import warnings

        warnings.warn(
            f"lambda_det.config.{name} moved to lambda_det.run_config.{name}; "
            f"import it from there (this alias goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        value = getattr(importlib.import_module("lambda_det.run_config"), name)
        globals()[name] = value  # warned once: `from ... import` looks the name up twice
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
