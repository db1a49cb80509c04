"""Training and evaluation on top of detectron2's ``DefaultTrainer`` (used by tools/train_net.py)."""
import argparse
import json
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import List, Optional

from detectron2.config import CfgNode
from detectron2.data import build_detection_test_loader, build_detection_train_loader
from detectron2.engine import DefaultTrainer, default_argument_parser, default_setup
from detectron2.evaluation import COCOEvaluator
from detectron2.utils import comm
from lambda_det.config import get_cfg
from lambda_det.data import build_mapper

__all__ = ["Trainer", "argument_parser", "resolve_config_file", "setup_cfg", "CONFIG_ROOTS",
           "adapt_norms_to_device", "write_json_atomically"]

logger = logging.getLogger(__name__)

# Where a bare config name is looked up: the checkout's configs/, then ./configs.
CONFIG_ROOTS = [Path(__file__).resolve().parents[2] / "configs", Path.cwd() / "configs"]
_NORM_KEYS = ("MODEL.LAMBDA_RESNET.NORM", "MODEL.RESNETS.NORM", "MODEL.FPN.NORM",
              "MODEL.ROI_BOX_HEAD.NORM", "MODEL.ROI_MASK_HEAD.NORM", "MODEL.SEM_SEG_HEAD.NORM")


def resolve_config_file(name: str) -> str:
    """A config path as given, or a bare name (with or without .yaml) found under configs/."""
    if os.path.isfile(name):
        return name
    file_name = name if name.endswith(".yaml") else name + ".yaml"
    matches = []
    for root in CONFIG_ROOTS:
        if root.is_dir():
            matches += [p for p in sorted(root.rglob("*.yaml"))
                        if p.name == Path(file_name).name and str(p).endswith(file_name)]
    unique = sorted({str(p.resolve()) for p in matches})
    if len(unique) == 1:
        return unique[0]
    if len(unique) > 1:
        raise FileNotFoundError(f"config {name!r} is ambiguous; it matches {unique}")
    roots = ", ".join(str(root) for root in CONFIG_ROOTS)
    raise FileNotFoundError(f"config {name!r} is neither a file nor a config name under {roots}")


def adapt_norms_to_device(cfg: CfgNode) -> List[str]:
    """On the CPU, "SyncBN" (torch's SyncBatchNorm needs CUDA to synchronise) becomes detectron2's
    "naiveSyncBN", which synchronises through torch.distributed (gloo on the CPU) and is plain BN
    in a single process. Returns the keys it changed."""
    changed = []
    if cfg.MODEL.DEVICE != "cpu":
        return changed
    for key in _NORM_KEYS:
        *parents, leaf = key.split(".")
        node = cfg
        for part in parents:
            node = node.get(part) if node is not None else None
        if node is not None and node.get(leaf) == "SyncBN":
            node[leaf] = "naiveSyncBN"
            changed.append(key)
    return changed


def setup_cfg(args: argparse.Namespace) -> CfgNode:
    """lambda_det's config from ``--config(-file)`` and trailing overrides, frozen."""
    cfg = get_cfg()
    if args.config_file:
        args.config_file = resolve_config_file(args.config_file)  # default_setup logs it
        cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    changed = adapt_norms_to_device(cfg)
    cfg.freeze()
    default_setup(cfg, args)
    if changed:
        logger.info("MODEL.DEVICE is cpu: SyncBN -> naiveSyncBN for %s", ", ".join(changed))
    return cfg


def write_json_atomically(path: str, data) -> None:
    """Write JSON so that a crash mid-write never leaves a truncated file behind."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(temporary, path)


class Trainer(DefaultTrainer):
    """DefaultTrainer with the LSJ mapper and COCO evaluation (AP by object size) written to
    ``OUTPUT_DIR/eval_results.json``."""

    @classmethod
    def build_train_loader(cls, cfg):
        return build_detection_train_loader(cfg, mapper=build_mapper(cfg, is_train=True))

    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        return build_detection_test_loader(cfg, dataset_name,
                                           mapper=build_mapper(cfg, is_train=False))

    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder: Optional[str] = None):
        output_folder = output_folder or os.path.join(cfg.OUTPUT_DIR, "inference", dataset_name)
        return COCOEvaluator(dataset_name, output_dir=output_folder)

    @classmethod
    def test(cls, cfg, model, evaluators=None):
        results = super().test(cfg, model, evaluators)
        if comm.is_main_process() and results:
            os.makedirs(cfg.OUTPUT_DIR, exist_ok=True)
            record = {"config": cfg.dump(), "results": _plain(results)}
            write_json_atomically(os.path.join(cfg.OUTPUT_DIR, "eval_results.json"), record)
        return results


def _plain(results):
    """OrderedDicts and numpy floats to plain JSON types."""
    if isinstance(results, (dict, OrderedDict)):
        return {key: _plain(value) for key, value in results.items()}
    return float(results)


def argument_parser() -> argparse.ArgumentParser:
    """detectron2's ``default_argument_parser`` plus ``--config NAME`` (an alias of --config-file
    that also accepts a bare name found under configs/)."""
    parser = default_argument_parser()
    parser.add_argument("--config", dest="config_file", metavar="NAME",
                        help="config file, or a bare name under configs/ (e.g. "
                             "lambda_r152_mask_rcnn.yaml)")
    return parser
