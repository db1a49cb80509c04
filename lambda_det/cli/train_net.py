"""The command line of tools/train_net.py: detectron2's, plus one run per OUTPUT_DIR, weights
and configs checked before any process starts, and user errors reported in one line.

A mistake in what the user passed (a config key or value, a dataset, a weights file, an
OUTPUT_DIR in use) ends the run with exit status 2 and one ``error: ...`` line that names the
bad value and the fix; ``--debug`` shows the traceback instead. Anything else is a bug and keeps
its traceback.
"""
import argparse
import logging
import warnings
from typing import Callable, NamedTuple, Optional, Sequence

import torch
from torch import nn
from torch.multiprocessing import ProcessExitedException
from detectron2.engine import default_argument_parser
from detectron2.modeling import build_model
from lambda_det.checkpoint import (
    AtomicCheckpointer, check_weights, checkpoint_to_resume, load_weights)
from lambda_det.cli.arguments import USAGE_ERROR_STATUS, parse_command_line, reporting_user_errors
from lambda_det.cli.output_dir import (
    PREVIOUS_RUN_PREFIX, OutputDirLock, evaluation_output_dir, prepare_output_dir)
from lambda_det.compat import quiet_detectron2_warnings
from lambda_det.config import load_config
from lambda_det.data.checks import check_run_datasets
from lambda_det.data.coco import coco_dataset_overrides
from lambda_det.engine import preflight
from lambda_det.engine.launch import launch
from lambda_det.engine.preflight import (
    Setting, check_batch_size, check_launch_arguments, check_training_memory,
    check_training_settings, yaml_training_settings)
from lambda_det.engine.trainer import Trainer, evaluation_weights, setup_cfg
from lambda_det.modeling.build import check_training_recipe
from lambda_det.utils.atomic import DISK_ERRNOS, OutputWriteError, reporting_write_errors

__all__ = ["argument_parser", "main", "run", "load_run_config", "launch_checked", "check_model",
           "check_config_before_launch", "check_weights_fit", "check_device", "plan_evaluation",
           "Evaluation", "prepare_training_output_dir"]

# How the help of tools/train_net.py names its config's keys; tools/lazyconfig_train_net.py
# passes its own (lambda_det.cli.lazyconfig_train_net).
YAML_OUTPUT_DIR = "OUTPUT_DIR"
YAML_DATASETS = "DATASETS.TRAIN / TEST (the run's config keeps it in DATASETS.COCO_INSTANCES)"


def argument_parser(output_dir: str = YAML_OUTPUT_DIR,
                    datasets: str = YAML_DATASETS) -> argparse.ArgumentParser:
    """detectron2's ``default_argument_parser`` plus ``--config NAME`` (an alias of
    --config-file that also takes a shipped config's name), ``--restart``, ``--debug`` and
    ``--coco-dataset NAME JSON IMAGE_DIR`` (see :mod:`lambda_det.data.coco`); the help names
    the output folder and the dataset keys as ``output_dir`` and ``datasets``."""
    parser = default_argument_parser()
    parser.add_argument("--config", dest="config_file", metavar="NAME",
                        help="config file, or the name of a shipped config (e.g. "
                             "lambda_r152_mask_rcnn)")
    parser.add_argument("--restart", action="store_true",
                        help=f"train from iteration 0 in an {output_dir} that holds a run; the "
                             f"previous run is first moved to {output_dir}/{PREVIOUS_RUN_PREFIX}"
                             "<date-time>/")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of errors in the input instead of one line")
    parser.add_argument("--coco-dataset", nargs=3, action="append", default=[],
                        metavar=("NAME", "JSON", "IMAGE_DIR"),
                        help=f"register a COCO-format dataset under NAME (repeatable); use NAME "
                             f"in {datasets}")
    return parser


def run(args: argparse.Namespace):
    """What every training or evaluation process runs (detectron2's ``main(args)``)."""
    quiet_detectron2_warnings()
    with reporting_user_errors(args.debug):
        cfg = setup_cfg(args)
        if args.eval_only:
            model = Trainer.build_model(cfg)
            load_weights(model, evaluation_weights(cfg, resume=args.resume))
            return Trainer.test(cfg, model)
        trainer = Trainer(cfg)
        trainer.resume_or_load(resume=args.resume)
    with reporting_user_errors(args.debug, errors=(OutputWriteError,)), \
            reporting_write_errors(cfg.OUTPUT_DIR, "OUTPUT_DIR", errnos=DISK_ERRNOS):
        return trainer.train()


def check_model(cfg) -> nn.Module:
    """The model of ``cfg`` built on the meta device: the backbone's and heads' checks of the
    config (depth, placement, scope, norms, features) in a fraction of a second, with no memory
    and no random numbers drawn."""
    meta = cfg.clone()
    meta.defrost()
    meta.MODEL.DEVICE = "meta"
    with torch.device("meta"):
        return build_model(meta)


def check_device(cfg, key: str = "MODEL.DEVICE") -> None:
    """``cfg.MODEL.DEVICE`` names a device that this machine has, for the tools that run one
    process (predict, export, the demo's pictures); ``key``: where the user set it, for the
    message (:func:`lambda_det.engine.preflight.check_device`)."""
    preflight.check_device(Setting(key, cfg.MODEL.DEVICE), num_gpus=1)

def check_weights_fit(model: nn.Module, weights: str, require: str) -> None:
    """Read ``weights`` as the run will (safely) and check that it fits ``model`` (a meta-device
    model: nothing is copied), quietly: the run itself logs what it loads."""
    checkpointer = AtomicCheckpointer(model, require=require)
    checkpointer.logger = logging.getLogger("lambda_det.cli.train_net.preflight")
    checkpointer.logger.disabled = True
    with warnings.catch_warnings():  # "copying ... to a meta parameter ... is a no-op"
        warnings.simplefilter("ignore", UserWarning)
        checkpointer.load(weights, checkpointables=[])


class Evaluation(NamedTuple):
    """Where an ``--eval-only`` run writes and what it evaluates (see :func:`plan_evaluation`)."""
    output_dir: str
    weights: str


def plan_evaluation(args: argparse.Namespace, output_dir: str, weights: str) -> None:
    """Decide once, before any process starts, where ``--eval-only`` writes: ``output_dir``, or
    a new ``output_dir/eval_<date-time>/`` when it holds a run (:func:`evaluation_output_dir`),
    so that the evaluation replaces none of the run's files. The weights are resolved here, while
    ``output_dir``'s last_checkpoint is in sight. Every process reads ``args.evaluation``
    (tools/train_net.py and tools/lazyconfig_train_net.py set their config from it)."""
    folder = evaluation_output_dir(output_dir)
    if folder != output_dir:
        print(f"--eval-only: {output_dir} holds a run, which this evaluation leaves as it is: "
              f"it writes into {folder} (weights {weights})", flush=True)
    args.evaluation = Evaluation(folder, weights)


def check_config_before_launch(args: argparse.Namespace, cfg) -> nn.Module:
    """What the config alone decides, checked before OUTPUT_DIR is touched: the device, the
    model (built on the meta device, returned for the weights' checks) and, for training, every
    setting that would fail after launch and the memory a process needs at least
    (:mod:`lambda_det.engine.preflight`)."""
    preflight.check_device(Setting("MODEL.DEVICE", cfg.MODEL.DEVICE), args.num_gpus)
    model = check_model(cfg)
    if args.eval_only:
        return model
    check_training_settings(yaml_training_settings(cfg))  # the values as the user wrote them
    check_training_recipe(cfg)
    world_size = args.num_gpus * args.num_machines
    scaled = yaml_training_settings(scale_to_world_size(cfg, world_size))
    check_batch_size(scaled.batch.value, world_size)
    check_training_memory(model, scaled, cfg.MODEL.DEVICE, args.num_gpus, world_size)
    return model


def scale_to_world_size(cfg, world_size: int):
    """The config the trainer runs on ``world_size`` processes: detectron2's
    ``auto_scale_workers`` (SOLVER.REFERENCE_WORLD_SIZE), its assertion as a ValueError."""
    reference, batch = cfg.SOLVER.REFERENCE_WORLD_SIZE, cfg.SOLVER.IMS_PER_BATCH
    if reference and batch % reference:
        raise ValueError(f"SOLVER.IMS_PER_BATCH {batch} does not split over "
                         f"SOLVER.REFERENCE_WORLD_SIZE {reference}: use a multiple of it")
    return Trainer.auto_scale_workers(cfg, world_size)


def prepare_training_output_dir(args: argparse.Namespace, output_dir: str,
                                key: str = YAML_OUTPUT_DIR) -> None:
    """:func:`prepare_output_dir` for this run, saying where the previous run's files went
    (``key``: the folder's name in the config, for errors)."""
    previous = prepare_output_dir(output_dir, resume=args.resume, restart=args.restart,
                                  machine_rank=args.machine_rank, key=key)
    if previous:
        print(f"--restart: moved the previous run's files in {output_dir} to {previous}: this "
              f"run starts at iteration 0 with files of its own", flush=True)


def _check_before_launch(args: argparse.Namespace, cfg, model: nn.Module) -> None:
    """What the run reads, checked once before any process starts and before OUTPUT_DIR is
    written (the lock is already held): a mistake found later would leave a log or a config
    dump in OUTPUT_DIR, or surface hours later at the final evaluation."""
    if args.eval_only:
        check_run_datasets(cfg, training=False)
        weights = evaluation_weights(cfg, resume=args.resume)
        check_weights_fit(model, weights, require="all")
        plan_evaluation(args, cfg.OUTPUT_DIR, weights)
        return
    check_run_datasets(cfg)
    latest = checkpoint_to_resume(cfg.OUTPUT_DIR) if args.resume else None
    if latest is not None:  # as Trainer.resume_or_load will load it
        check_weights_fit(model, latest, require="all")
    elif cfg.MODEL.WEIGHTS:
        check_weights(cfg.MODEL.WEIGHTS)
        check_weights_fit(model, cfg.MODEL.WEIGHTS, require="backbone")
    prepare_training_output_dir(args, cfg.OUTPUT_DIR)


def load_run_config(args: argparse.Namespace):
    """The config of ``--config-file`` and the trailing overrides (``args.opts``), with the
    ``--coco-dataset`` triples added to ``DATASETS.COCO_INSTANCES`` as an override in
    ``args.opts``, so that every process registers them."""
    cfg = load_config(args.config_file, args.opts)
    if args.coco_dataset:
        args.opts = [*args.opts, *coco_dataset_overrides(cfg.DATASETS.COCO_INSTANCES,
                                                         args.coco_dataset)]
        cfg = load_config(args.config_file, args.opts)
    return cfg


def main(argv: Optional[Sequence[str]] = None) -> int:
    """tools/train_net.py: returns the exit status."""
    args = parse_command_line(argument_parser(), argv)
    print("Command Line Args:", args)
    with reporting_user_errors(args.debug):
        check_launch_arguments(args)
        cfg = load_run_config(args)
        model = check_config_before_launch(args, cfg)
    cpu = torch.device(cfg.MODEL.DEVICE).type == "cpu"
    return launch_checked(run, args, cfg.OUTPUT_DIR,
                          lambda: _check_before_launch(args, cfg, model), cpu=cpu)


def launch_checked(run_function, args: argparse.Namespace, output_dir: str,
                   check: Callable[[], None], cpu: bool,
                   output_dir_key: str = YAML_OUTPUT_DIR) -> int:
    """Hold ``output_dir``'s lock (on machine 0, whose main process writes it; taking it checks
    that the folder can be written), run ``check``, then ``run_function(args)`` in every
    process (on the CPU, ``--num-gpus N`` starts N gloo processes: detectron2's launch needs
    CUDA). Returns the exit status: 2 when a check or a
    worker reported a user error. ``output_dir_key`` names the folder in errors."""
    lock = None
    with reporting_user_errors(args.debug):
        if args.machine_rank == 0:
            lock = OutputDirLock(output_dir, key=output_dir_key).acquire()
    try:
        with reporting_user_errors(args.debug):
            check()
        launch(run_function, args.num_gpus, num_machines=args.num_machines,
               machine_rank=args.machine_rank, dist_url=args.dist_url, args=(args,), cpu=cpu)
    except ProcessExitedException as error:  # a worker reported a user error and exited 2
        if error.exit_code != USAGE_ERROR_STATUS:
            raise
        return USAGE_ERROR_STATUS
    finally:
        if lock is not None:
            lock.release()
    return 0
