"""Training and evaluation on top of detectron2's ``DefaultTrainer`` (used by tools/train_net.py)."""
import argparse
import fnmatch
import json
import logging
import os
import time
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import List, Optional, Sequence

from detectron2.config import CfgNode
from detectron2.data import (
    build_detection_test_loader, build_detection_train_loader)
from detectron2.engine import (
    AMPTrainer, DefaultTrainer, SimpleTrainer, TrainerBase, create_ddp_model,
    default_argument_parser, default_setup)
from detectron2.evaluation import COCOEvaluator
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from detectron2.utils.logger import setup_logger
from lambda_det.config import get_cfg
from detectron2.engine.hooks import PeriodicWriter
from lambda_det.data import build_mapper
from lambda_det.data.checks import load_checked_dataset_dicts
from lambda_det.engine.atomic import atomic_path
from lambda_det.engine.checkpoint import AtomicCheckpointer, StrictCheckpointer, check_weights
from lambda_det.engine.deterministic import DeterministicTrainLoader, SeedEachIteration

__all__ = ["Trainer", "argument_parser", "build_cfg", "load_cfg", "resolve_config_file",
           "setup_cfg", "CONFIG_ROOTS", "adapt_norms_to_device", "write_json_atomically",
           "prepare_output_dir", "evaluation_weights", "load_weights_for_evaluation",
           "PREVIOUS_RUN_PREFIX"]

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


def load_cfg(config_file: Optional[str], opts: Sequence[str] = ()) -> CfgNode:
    """lambda_det's defaults, then the file (a path or a bare name under configs/; none: only
    the defaults), then ``KEY VALUE`` overrides. Not frozen."""
    cfg = get_cfg()
    if config_file:
        cfg.merge_from_file(resolve_config_file(config_file))
    cfg.merge_from_list(list(opts))
    return cfg


def build_cfg(args: argparse.Namespace) -> CfgNode:
    """lambda_det's config from ``--config(-file)`` and trailing overrides (not frozen)."""
    if args.config_file:
        args.config_file = resolve_config_file(args.config_file)  # default_setup logs it
    return load_cfg(args.config_file, args.opts)


def setup_cfg(args: argparse.Namespace) -> CfgNode:
    """The frozen config, with detectron2's ``default_setup`` (logging, seeds, config dump)."""
    cfg = build_cfg(args)
    changed = adapt_norms_to_device(cfg)
    cfg.freeze()
    default_setup(cfg, args)
    if changed:
        logger.info("MODEL.DEVICE is cpu: SyncBN -> naiveSyncBN for %s", ", ".join(changed))
    return cfg


def write_json_atomically(path: str, data) -> None:
    """Write JSON so that a crash mid-write never leaves a truncated file behind."""
    with atomic_path(path) as temporary, open(temporary, "w") as f:
        json.dump(data, f, indent=2)


def _last_checkpoint(output_dir: str) -> Optional[str]:
    """The file name ``output_dir/last_checkpoint`` points at, or None without one."""
    path = os.path.join(output_dir, "last_checkpoint")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip()


PREVIOUS_RUN_PREFIX = "previous_"
# What a run writes into OUTPUT_DIR (detectron2's trainer, evaluators and writers; the demo's
# table and pictures): what --restart moves aside. Other files there are left alone.
RUN_FILES = ("last_checkpoint", "model_*.pth", "*.pth.*.tmp", "metrics.json",
             "eval_results.json", "config.yaml", "log.txt*", "events.out.tfevents.*", "inference",
             "ap_table.md", "ap_by_size.png", "predictions.png")


def prepare_output_dir(output_dir: str, resume: bool, restart: bool,
                       machine_rank: int = 0) -> Optional[str]:
    """Refuse to train from scratch over the run that ``output_dir`` already holds.

    Detectron2 would start again at iteration 0, replace the run's checkpoints one by one and
    append to its metrics.json. Decision: starting over takes ``restart``, which first moves the
    run's files (:data:`RUN_FILES`: checkpoints, last_checkpoint, metrics, evaluation, logs) into
    ``output_dir/previous_<date-time>/``: nothing is deleted and nothing mixes. Only machine 0
    moves files (detectron2 writes them from the main process only).

    Returns:
        the folder the previous run was moved to, or None.

    Raises:
        FileExistsError: ``output_dir`` has a last_checkpoint, and neither ``resume`` nor
            ``restart`` is set.
    """
    latest = _last_checkpoint(output_dir)
    if resume or latest is None:
        return None
    if not restart:
        raise FileExistsError(
            f"OUTPUT_DIR {output_dir!r} already holds a run (last checkpoint {latest}): pass "
            f"--resume to continue it, another OUTPUT_DIR to keep it, or --restart to start "
            f"over in it (the previous run is moved to {PREVIOUS_RUN_PREFIX}<date-time>/)")
    if machine_rank != 0:
        return None
    previous = os.path.join(output_dir, PREVIOUS_RUN_PREFIX + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(previous)
    for name in sorted(os.listdir(output_dir)):
        if any(fnmatch.fnmatch(name, pattern) for pattern in RUN_FILES):
            os.replace(os.path.join(output_dir, name), os.path.join(previous, name))
    return previous


def evaluation_weights(cfg: CfgNode, resume: bool) -> str:
    """The checkpoint ``--eval-only`` evaluates: OUTPUT_DIR's last checkpoint with ``resume``
    (when there is one), else ``MODEL.WEIGHTS``.

    Raises:
        ValueError: no weights at all (detectron2 would evaluate a randomly initialised model).
        FileNotFoundError: a local checkpoint file that does not exist.
    """
    latest = _last_checkpoint(cfg.OUTPUT_DIR) if resume else None
    if latest is not None:
        return os.path.join(cfg.OUTPUT_DIR, latest)
    if resume and not cfg.MODEL.WEIGHTS:
        raise ValueError(f"--eval-only needs trained weights: MODEL.WEIGHTS is empty and "
                         f"OUTPUT_DIR {cfg.OUTPUT_DIR!r} has no last_checkpoint")
    check_weights(cfg.MODEL.WEIGHTS)
    return cfg.MODEL.WEIGHTS


def load_weights_for_evaluation(model, cfg: CfgNode, resume: bool) -> str:
    """Load :func:`evaluation_weights` into ``model``; every weight must load (detectron2 would
    evaluate a half-random model after a warning). Returns the file."""
    weights = evaluation_weights(cfg, resume)
    StrictCheckpointer(model).load(weights, checkpointables=[])
    return weights


class Trainer(DefaultTrainer):
    """Detectron2's ``DefaultTrainer`` with:

    * the LSJ mapper when ``INPUT.LSJ.ENABLED``;
    * COCO evaluation (boxes and masks, AP by object size) also written to
      ``OUTPUT_DIR/eval_results.json``; other metrics (PQ, mIoU) need a subclass that overrides
      ``build_evaluator``, as in detectron2's tools/train_net.py;
    * checkpoints written atomically (:class:`AtomicCheckpointer`), with the optimizer state
      (detectron2 0.6 leaves it out, so ``--resume`` restarted momentum from zero);
    * CPU data-parallel training over gloo (detectron2 0.6 passes GPU device ids to DDP);
    * ``DATALOADER.DETERMINISTIC``: every iteration a function of (SEED, iteration), so that
      ``--resume`` continues exactly (see :mod:`lambda_det.engine.deterministic`).
    """

    def __init__(self, cfg: CfgNode):
        # DefaultTrainer.__init__, with the DDP, checkpointer and deterministic-loader changes.
        TrainerBase.__init__(self)
        if not logging.getLogger("detectron2").isEnabledFor(logging.INFO):
            setup_logger()
        cfg = DefaultTrainer.auto_scale_workers(cfg, comm.get_world_size())
        period = cfg.SOLVER.LOG_PERIOD  # checked on every rank: only the main one has the writer
        if not isinstance(period, int) or isinstance(period, bool) or period < 1:
            raise ValueError(f"SOLVER.LOG_PERIOD must be an integer >= 1 (iterations), "
                             f"got {period!r}")
        if cfg.DATALOADER.get("DETERMINISTIC", False):
            if cfg.SEED < 0:
                raise ValueError("DATALOADER.DETERMINISTIC needs a fixed SEED >= 0, got "
                                 f"SEED={cfg.SEED}")
            seed_all_rng(cfg.SEED)  # the same initial weights on every rank and every run
        model = self.build_model(cfg)
        optimizer = self.build_optimizer(cfg, model)
        data_loader = self.build_train_loader(cfg)
        ddp_options = {"device_ids": None} if cfg.MODEL.DEVICE == "cpu" else {}
        model = create_ddp_model(model, broadcast_buffers=False, **ddp_options)
        trainer_class = AMPTrainer if cfg.SOLVER.AMP.ENABLED else SimpleTrainer
        self._trainer = trainer_class(model, data_loader, optimizer)
        self.data_loader = data_loader
        self.scheduler = self.build_lr_scheduler(cfg, optimizer)
        self.checkpointer = AtomicCheckpointer(model, cfg.OUTPUT_DIR, trainer=weakref.proxy(self))
        self.start_iter = 0
        self.max_iter = cfg.SOLVER.MAX_ITER
        self.cfg = cfg
        self.register_hooks(self.build_hooks())

    def build_hooks(self):
        hooks = super().build_hooks()
        if self.cfg.DATALOADER.get("DETERMINISTIC", False):
            hooks.insert(0, SeedEachIteration(self.cfg.SEED))
        if hooks and isinstance(hooks[-1], PeriodicWriter):  # detectron2 fixes the period at 20
            hooks[-1] = PeriodicWriter(self.build_writers(), period=self.cfg.SOLVER.LOG_PERIOD)
        return hooks

    def state_dict(self):
        # detectron2 0.6's DefaultTrainer saves only the iteration and hook states: the
        # optimizer's momentum buffers were lost on --resume. Save the inner trainer too.
        state = super().state_dict()
        state["_trainer"] = self._trainer.state_dict()
        return state

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if "_trainer" in state_dict:  # checkpoints of plain detectron2 0.6 runs have none
            self._trainer.load_state_dict(state_dict["_trainer"])

    def resume_or_load(self, resume: bool = True):
        super().resume_or_load(resume=resume)
        if isinstance(self.data_loader, DeterministicTrainLoader):
            self.data_loader.start_iteration = self.start_iter

    @classmethod
    def build_train_loader(cls, cfg):
        mapper = build_mapper(cfg, is_train=True)
        dataset = load_checked_dataset_dicts(
            cfg.DATASETS.TRAIN, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS,
            require_masks=cfg.MODEL.MASK_ON)
        if not cfg.DATALOADER.get("DETERMINISTIC", False):
            return build_detection_train_loader(cfg, mapper=mapper, dataset=dataset)
        return DeterministicTrainLoader(dataset, mapper, cfg.SOLVER.IMS_PER_BATCH, cfg.SEED,
                                        comm.get_rank(), comm.get_world_size())

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
    that also accepts a bare name found under configs/) and ``--restart``
    (see :func:`prepare_output_dir`)."""
    parser = default_argument_parser()
    parser.add_argument("--restart", action="store_true",
                        help="train from iteration 0 in an OUTPUT_DIR that holds a run; the "
                             f"previous run is first moved to OUTPUT_DIR/{PREVIOUS_RUN_PREFIX}"
                             "<date-time>/")
    parser.add_argument("--config", dest="config_file", metavar="NAME",
                        help="config file, or a bare name under configs/ (e.g. "
                             "lambda_r152_mask_rcnn.yaml)")
    return parser
