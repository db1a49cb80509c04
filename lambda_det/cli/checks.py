"""What several commands share before they run: the config of a training command line
(:func:`load_run_config`: tools/train_net.py, tools/check_dataset.py), the device of a
one-process tool (:func:`check_device`: predict, export, the demo's pictures), and the model a
config builds, on the meta device (:func:`check_model`, :func:`check_weights_fit`: training's
checks before launch, the timm converter, backbone comparisons)."""

import argparse
import logging
import warnings
from typing import Optional, Sequence

import torch
from torch import nn

from lambda_det.checkpoint import AtomicCheckpointer
from lambda_det.data import register_datasets
from lambda_det.data.coco import coco_dataset_overrides
from lambda_det.engine import preflight
from lambda_det.modeling.build import build_detectron2_model
from lambda_det.run_config import load_config
from lambda_det.utils.setting import Setting

__all__ = [
    "load_run_config",
    "check_device",
    "check_model",
    "build_yaml_model",
    "check_weights_fit",
]


def load_run_config(args: argparse.Namespace, opts: Optional[Sequence[str]] = None):
    """The config of ``--config-file`` and the trailing overrides (``opts``, default
    ``args.opts``), with the ``--coco-dataset`` triples (``args.coco_dataset``) added to
    ``DATASETS.COCO_INSTANCES``; its datasets registered in this process
    (:func:`lambda_det.data.register_datasets`). Every process of a run loads its config here,
    from the same command line, which it leaves as it is."""
    cfg = load_config(args.config_file, args.opts if opts is None else opts, freeze=False)
    if args.coco_dataset:  # merged as load_config merges overrides: the file is read once
        cfg.merge_from_list(coco_dataset_overrides(cfg.DATASETS.COCO_INSTANCES, args.coco_dataset))
    cfg.freeze()
    register_datasets(cfg)
    return cfg


def check_device(cfg, key: str = "MODEL.DEVICE") -> None:
    """``cfg.MODEL.DEVICE`` names a device that this machine has, for the tools that run one
    process (predict, export, the demo's pictures); ``key``: where the user set it, for the
    message (:func:`lambda_det.engine.preflight.check_device`)."""
    preflight.check_device(Setting(key, cfg.MODEL.DEVICE), num_gpus=1)


def check_model(cfg) -> nn.Module:
    """The model of a yaml config built on the meta device: the backbone's and heads' checks
    of the config (depth, placement, scope, norms, features) in a fraction of a second, with
    no memory and no random numbers drawn."""
    with torch.device("meta"):
        return build_yaml_model(cfg, "meta")


def build_yaml_model(cfg, device: str) -> nn.Module:
    """detectron2's ``build_model`` (:func:`build_detectron2_model`) with MODEL.DEVICE
    ``device`` (for "meta", call it under a meta device context)."""
    if device != cfg.MODEL.DEVICE:
        cfg = cfg.clone()
        cfg.defrost()
        cfg.MODEL.DEVICE = device
    return build_detectron2_model(cfg)


def check_weights_fit(model: nn.Module, weights: str, require: str) -> None:
    """Read ``weights`` as the run will (safely) and check that it fits ``model`` (a meta-device
    model: nothing is copied), quietly: the run itself logs what it loads."""
    checkpointer = AtomicCheckpointer(model, require=require)
    checkpointer.logger = logging.getLogger(__name__)
    checkpointer.logger.disabled = True
    with warnings.catch_warnings():  # "copying ... to a meta parameter ... is a no-op"
        warnings.simplefilter("ignore", UserWarning)
        checkpointer.load(weights, checkpointables=[])
