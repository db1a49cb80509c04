"""The shipped configs (the paper's Table 14 recipes, detection variants, the demo), found by
name in a checkout or an installed package, like detectron2's ``model_zoo``::

    from lambda_det import model_zoo
    model_zoo.get_config_file("COCO-InstanceSegmentation/lambda_r152_mask_rcnn.yaml")
    cfg = model_zoo.get_config("lambda_r152_mask_rcnn")   # a unique file name is enough
    lazy = model_zoo.get_config("lambda_r152_mask_rcnn.py")  # the LazyConfig recipe

No pretrained weights exist: the paper's detection recipe trains from scratch.
"""

from typing import Sequence

from lambda_det.config.shipped import config_root, get_config_file, list_configs

__all__ = ["get_config_file", "get_config", "list_configs", "config_root"]


def get_config(name: str, opts: Sequence[str] = ()):
    """The config of a shipped config name or a file: a yaml config with lambda_det's defaults
    and ``KEY VALUE`` overrides (see :func:`lambda_det.run_config.load_config`; not frozen), or
    for a .py name a LazyConfig with ``key=value`` overrides (see
    :func:`lambda_det.config.lazy.load_lazy_config`). It registers no dataset (training with it
    in your own code: :func:`lambda_det.data.register_datasets` first)."""
    if name.endswith(".py"):
        from lambda_det.config.lazy import load_lazy_config

        return load_lazy_config(name, opts)
    from lambda_det.run_config import load_config

    return load_config(name, opts, freeze=False)
