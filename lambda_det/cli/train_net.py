"""The command line of tools/train_net.py (yaml configs) and tools/lazyconfig_train_net.py
(LazyConfig recipes): detectron2's, plus one run per output folder, weights and configs checked
before any process starts, and user errors reported in one line. The two tools run one
:func:`main`; they differ only in how they read the config (:class:`ConfigSystem`:
:data:`YAML_CONFIGS`, :data:`LAZY_CONFIGS`), which gives the checks the same
:class:`~lambda_det.engine.run_settings.RunSettings`.

A mistake in what the user passed (a config key or value, a dataset, a weights file, an
OUTPUT_DIR in use) ends the run with exit status 2 and one ``error: ...`` line that names the
bad value and the fix; ``--debug`` shows the traceback instead. Anything else is a bug and keeps
its traceback.
"""

import argparse
import contextlib
import copy
import os
import sys
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Sequence

import torch
from detectron2.config import instantiate
from detectron2.engine import default_argument_parser
from detectron2.utils import comm
from omegaconf import DictConfig
from torch import nn
from torch.multiprocessing import ProcessExitedException

from lambda_det.checkpoint import (
    AtomicCheckpointer,
    check_weights,
    checkpoint_to_resume,
    evaluation_weights,
    last_checkpoint,
    load_checkpoint_file,
    load_weights,
)
from lambda_det.cli.arguments import (
    USAGE_ERROR_STATUS,
    add_coco_dataset_argument,
    add_debug_argument,
    parse_command_line,
    reporting_user_errors,
)
from lambda_det.cli.checks import build_yaml_model, check_weights_fit, load_run_config
from lambda_det.cli.interrupts import (
    Interrupted,
    invoked_as,
    reporting_interrupts,
    rerun_command,
)
from lambda_det.cli.output_dir import (
    PREVIOUS_RUN_PREFIX,
    OutputDirLock,
    evaluation_output_dir,
    holds_run_files,
    not_the_runs,
    prepare_output_dir,
    record_run,
)
from lambda_det.compat import quiet_detectron2_warnings
from lambda_det.config import resolve_config_file
from lambda_det.config.lazy import load_lazy_config, resolve_lazy_config_file, scale_to_world_size
from lambda_det.data import register_datasets
from lambda_det.data.checks import check_run_datasets
from lambda_det.data.coco import register_coco_triples
from lambda_det.engine import lazy_training, preflight
from lambda_det.engine.interrupt import SIGNALS
from lambda_det.engine.launch import launch
from lambda_det.engine.preflight import (
    check_batch_size,
    check_evaluation_memory,
    check_launch_arguments,
    check_training_memory,
    check_training_settings,
)
from lambda_det.engine.run_settings import RunSettings, lazy_run_settings, yaml_run_settings
from lambda_det.engine.trainer import Trainer, plain_default_setup, setup_cfg
from lambda_det.utils.atomic import DISK_ERRNOS, OutputWriteError, reporting_write_errors
from lambda_det.utils.errors import UserError

__all__ = [
    "ConfigSystem",
    "YAML_CONFIGS",
    "LAZY_CONFIGS",
    "argument_parser",
    "training_command_line",
    "main",
    "load_lazy_run_config",
    "scale_yaml_to_world_size",
    "checked_run",
    "CheckedRun",
    "launch_run",
    "check_config_before_launch",
    "plan_evaluation",
    "Evaluation",
    "prepare_training_output_dir",
    "check_run_not_finished",
    "RunFinishedError",
    "interrupted_line",
]

INTERRUPTED_STATUSES = tuple(128 + signum for signum in SIGNALS)  # 130, 143


class Evaluation(NamedTuple):
    """Where an ``--eval-only`` run writes and what it evaluates (see :func:`plan_evaluation`)."""

    output_dir: str
    weights: str


class ConfigSystem(NamedTuple):
    """How a training tool reads its config; everything else is :func:`main`'s."""

    description: str
    output_dir_key: str  # how the help and the errors name the output folder
    datasets_help: str  # where --coco-dataset's NAME goes
    resolve: Callable[[Optional[str]], str]  # the path of --config-file's file or NAME
    load: Callable[[argparse.Namespace], Any]  # the config of the command line
    settings: Callable[[Any], RunSettings]  # what the run reads, with its keys
    scale: Callable[[Any, int], Any]  # the config for a number of processes
    build_model: Callable[[Any, str], nn.Module]  # the model, on a device
    with_seed: Callable[[Any, int], Any]  # the config with its seed set
    # What every process runs: (args, the --eval-only plan or None, and when the process
    # that loaded the config runs it: the config).
    run: Callable[[argparse.Namespace, Optional[Evaluation], Any], Any]
    tool: str = "tools/train_net.py"  # the script, for the command that resumes a run


def argument_parser(
    output_dir: str = "OUTPUT_DIR", datasets: str = "DATASETS.TRAIN / TEST"
) -> argparse.ArgumentParser:
    """detectron2's ``default_argument_parser`` plus ``--config NAME`` (an alias of
    --config-file that also takes a shipped config's name), ``--restart``, ``--debug`` and
    ``--coco-dataset NAME JSON IMAGE_DIR`` (see :mod:`lambda_det.data.coco`); the help names
    the output folder and the dataset keys as ``output_dir`` and ``datasets``."""
    parser = default_argument_parser()
    parser.add_argument(
        "--config",
        dest="config_file",
        metavar="NAME",
        help="config file, or the name of a shipped config (e.g. lambda_r152_mask_rcnn)",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help=f"train from iteration 0 in an {output_dir} that holds a run; the "
        f"previous run is first moved to {output_dir}/{PREVIOUS_RUN_PREFIX}"
        "<date-time>/",
    )
    add_debug_argument(parser)
    add_coco_dataset_argument(parser, datasets)
    return parser


def run(args: argparse.Namespace, evaluation: Optional[Evaluation] = None, cfg=None):
    """What every process of tools/train_net.py runs (detectron2's ``main(args)``):
    ``evaluation``, where an ``--eval-only`` run writes and what it loads (decided before
    launch: :func:`plan_evaluation`); ``cfg``, the config as :func:`main` loaded it, when this
    is the process that loaded it (None: load it from ``args`` as :func:`main` did)."""
    quiet_detectron2_warnings()
    output_dir = []  # the run's, once its config is read
    with reporting_interrupts(lambda interrupt: interrupted_line(interrupt, args, output_dir)):
        with reporting_user_errors(args.debug):
            cfg = setup_cfg(load_run_config(args) if cfg is None else cfg, args, evaluation)
            output_dir.append(cfg.OUTPUT_DIR)
            if args.eval_only:
                model = Trainer.build_model(cfg)
                settings = yaml_run_settings(cfg)
                load_weights(
                    model,
                    evaluation_weights(settings.output_dir, settings.training.weights, args.resume),
                )
                return Trainer.test(cfg, model)
            trainer = Trainer(cfg)
            trainer.resume_or_load(resume=args.resume)
        with (
            reporting_user_errors(args.debug, errors=(OutputWriteError,)),
            reporting_write_errors(cfg.OUTPUT_DIR, "OUTPUT_DIR", errnos=DISK_ERRNOS),
        ):
            return trainer.train()


def run_lazy(args: argparse.Namespace, evaluation: Optional[Evaluation] = None, cfg=None):
    """What every process of tools/lazyconfig_train_net.py runs (arguments as :func:`run`)."""
    quiet_detectron2_warnings()
    output_dir = []  # the run's, once its config is read
    with reporting_interrupts(lambda interrupt: interrupted_line(interrupt, args, output_dir)):
        with reporting_user_errors(args.debug):
            if cfg is None:  # a started process: as main() loaded it, datasets registered
                cfg = load_lazy_run_config(args)
            if evaluation is not None:
                cfg.train.output_dir, cfg.train.init_checkpoint = evaluation
            output_dir.append(cfg.train.output_dir)
            scale_to_world_size(cfg, comm.get_world_size())
            plain_default_setup(cfg, args)
            if args.eval_only:
                model = lazy_training.build_model(cfg)
                settings = lazy_run_settings(cfg)
                weights = evaluation_weights(
                    settings.output_dir, settings.training.weights, args.resume
                )
                AtomicCheckpointer(model, require="all").load(weights, checkpointables=[])
                return lazy_training.evaluate(cfg, model)
        with reporting_user_errors(args.debug, errors=(OutputWriteError,)):
            return lazy_training.train(cfg, args.resume)


def interrupted_line(
    interrupt: Interrupted, args: argparse.Namespace, output_dir: Sequence[str]
) -> Optional[str]:
    """The line a run that SIGINT or SIGTERM stopped prints (on the main process): the
    checkpoint it saved, or its last one, and the command that continues it. ``output_dir``:
    the run's folder, once the run has it (empty before: the checks before launch, or the
    config being read)."""
    if not comm.is_main_process():
        return None
    stopped = f"interrupted by {interrupt.name}"
    tool, argv = getattr(args, "command", (YAML_CONFIGS.tool, ()))
    if args.eval_only:
        return f"{stopped}: the evaluation stopped; run it again with: {rerun_command(tool, argv)}"
    if not output_dir:
        return f"{stopped} before the run started: run it again with: {rerun_command(tool, argv)}"
    resume = rerun_command(tool, argv, add=["--resume"], drop=["--restart"])
    if interrupt.checkpoint:
        return (
            f"{stopped} after iteration {interrupt.iteration}: saved "
            f"{interrupt.checkpoint}; continue with: {resume}"
        )
    latest = last_checkpoint(output_dir[0])
    if latest:
        return (
            f"{stopped}: the run's last checkpoint is {os.path.join(output_dir[0], latest)}; "
            f"continue with: {resume}"
        )
    restart = rerun_command(tool, argv, add=["--restart"], drop=["--resume"])
    return f"{stopped} before the run's first checkpoint: start again with: {restart}"


def plan_evaluation(
    output_dir: str, weights: str, num_machines: int = 1, key: str = "OUTPUT_DIR"
) -> Evaluation:
    """Decide once, before any process starts, where ``--eval-only`` writes: ``output_dir``, or
    a new ``output_dir/eval_<date-time>/`` when it holds a run (:func:`evaluation_output_dir`),
    so that the evaluation replaces none of the run's files. The weights are resolved here, while
    ``output_dir``'s last_checkpoint is in sight. Every process gets the plan as an argument
    (:func:`run`, :func:`run_lazy`), and sets its config from it. Over ``num_machines`` > 1,
    each machine plans for itself and could not agree on a new folder: ``output_dir`` (``key``)
    must hold no run."""
    if num_machines > 1:
        if holds_run_files(output_dir):
            raise UserError(
                f"--eval-only on {num_machines} machines: {key} {output_dir} holds a run, and "
                f"the machines cannot agree on a new folder for the evaluation: set {key} to "
                f"a folder of its own (e.g. {os.path.join(output_dir, 'eval')})"
            )
        return Evaluation(output_dir, weights)
    folder = evaluation_output_dir(output_dir)
    if folder != output_dir:
        print(
            f"--eval-only: {output_dir} holds a run, which this evaluation leaves as it is: "
            f"it writes into {folder} (weights {weights})",
            flush=True,
        )
    return Evaluation(folder, weights)


def check_config_before_launch(
    args: argparse.Namespace, system: ConfigSystem, cfg, run: RunSettings
) -> nn.Module:
    """What the config alone decides, checked before the output folder is touched: the device,
    the model and, for training, every setting that would fail after launch (as the user wrote
    it) and, for the batch scaled to the processes, whether it splits over them and the memory
    a process needs at least; with test sets, the memory an evaluation process needs at least
    (:mod:`lambda_det.engine.preflight`); ``run``: ``system.settings(cfg)``.

    Returns the model built on the meta device (no weight allocated, no random number drawn:
    the run builds its own as detectron2 does), for the weights' checks."""
    preflight.check_device(run.device, args.num_gpus)
    if not args.eval_only:
        check_training_settings(run.training)
    world_size = args.num_gpus * args.num_machines
    preflight.check_seed(run.training.seed, world_size)
    with torch.device("meta"):
        model = system.build_model(cfg, "meta")
    device = run.device.value
    if run.data.test.value:  # evaluated by --eval-only, or at the end of training
        check_evaluation_memory(model, run.training.test_size, device, args.num_gpus)
    if args.eval_only:
        return model
    scaled = system.settings(system.scale(cfg, world_size)).training
    check_batch_size(scaled.batch.value, world_size, key=scaled.batch.key)
    check_training_memory(model, scaled, device, args.num_gpus, world_size)
    return model


def check_run_not_finished(args: argparse.Namespace, system: ConfigSystem, cfg, run) -> None:
    """``--resume`` of a run whose last checkpoint is of its last iteration has nothing to
    train: one line saying so and how to evaluate it or train longer, before the output folder
    is locked or written (detectron2 would evaluate again and append to the run's log)."""
    if not args.resume or args.eval_only:
        return
    folder = run.output_dir.value
    latest = checkpoint_to_resume(folder)
    if latest is None:
        return
    try:
        iteration = load_checkpoint_file(latest).get("iteration")
    except UserError:
        return  # the resume itself names what is wrong with it, after the other checks
    world_size = args.num_gpus * args.num_machines
    max_iter = system.settings(system.scale(cfg, world_size)).training.max_iter
    if type(iteration) is not int or iteration + 1 < max_iter.value:
        return
    weights = run.training.weights.key
    weights = f"{weights} {latest}" if weights == "MODEL.WEIGHTS" else f"{weights}={latest}"
    raise RunFinishedError(
        f"{run.output_dir.key} {folder!r} holds a finished run: its last checkpoint "
        f"{os.path.basename(latest)} is of iteration {iteration + 1}, {max_iter.key} "
        f"{max_iter.value}, so --resume has nothing to train (no file was touched): evaluate "
        f"it with --eval-only {weights}, or train longer with a larger {max_iter.key} and "
        f"--resume"
    )


class RunFinishedError(UserError):
    """``--resume`` of a run that trained all its iterations."""


def runs_in_this_process(args: argparse.Namespace) -> bool:
    """Whether the run is the launching process's own (one process in all, as launch decides)."""
    return args.num_gpus * args.num_machines == 1


def prepare_training_output_dir(
    args: argparse.Namespace, output_dir: str, key: str = "OUTPUT_DIR"
) -> None:
    """:func:`prepare_output_dir` for this run, saying where the previous run's files went and
    which files it left where they were (not the run's), then the run's record of its own files
    (:func:`record_run`, on machine 0); ``key``: the folder's name in the config, for errors."""
    left = not_the_runs(output_dir, key)
    previous = prepare_output_dir(
        output_dir,
        resume=args.resume,
        restart=args.restart,
        machine_rank=args.machine_rank,
        key=key,
    )
    if previous:
        kept = f" (left where they are, not the run's: {', '.join(left)})" if left else ""
        print(
            f"--restart: moved the previous run's files in {output_dir} to {previous}{kept}: "
            f"this run starts at iteration 0 with files of its own",
            flush=True,
        )
    if args.machine_rank == 0:
        record_run(output_dir, key)


def check_before_launch(
    args: argparse.Namespace, run: RunSettings, model: nn.Module
) -> Optional[Evaluation]:
    """What the run reads, checked once before any process starts and before the output folder
    is written (the lock is already held): a mistake found later would leave a log or a config
    dump in it, or surface hours later at the final evaluation. Returns the plan of an
    ``--eval-only`` run (:func:`plan_evaluation`), None for training."""
    output_dir, weights = run.output_dir, run.training.weights
    if args.eval_only:
        check_run_datasets(run.data, training=False)
        evaluated = evaluation_weights(output_dir, weights, resume=args.resume)
        check_weights_fit(model, evaluated, require="all")
        evaluation = plan_evaluation(output_dir.value, evaluated, args.num_machines, output_dir.key)
        if args.machine_rank == 0:  # the evaluation's files are a run's, for a later run there
            record_run(evaluation.output_dir, output_dir.key)
        return evaluation
    check_run_datasets(run.data)
    latest = checkpoint_to_resume(output_dir.value) if args.resume else None
    if latest is not None:  # as the trainer's resume_or_load will load it
        check_weights_fit(model, latest, require="all")
    elif weights.value:
        check_weights(weights.value, weights.key)
        check_weights_fit(model, weights.value, require="backbone")
    prepare_training_output_dir(args, output_dir.value, key=output_dir.key)
    return None


def resolve_yaml_config(name: Optional[str]) -> str:
    """The path of a yaml config file or shipped config's NAME; "" (detectron2's defaults)
    without one."""
    return resolve_config_file(name) if name else ""


def resolve_lazy_recipe(name: Optional[str]) -> str:
    """The path of a LazyConfig recipe or shipped recipe's NAME."""
    if not name:
        raise UserError(
            "pass a recipe: --config-file PATH.py, or --config NAME (e.g. lambda_r152_mask_rcnn)"
        )
    return resolve_lazy_config_file(name)


def load_lazy_run_config(args: argparse.Namespace) -> DictConfig:
    """The recipe of ``--config-file`` (its path: :func:`training_command_line`) and the
    trailing ``key=value`` overrides, with the bundled datasets and the ``--coco-dataset``
    triples registered in this process (every process of a run loads it here:
    :func:`run_lazy`)."""
    register_datasets()
    register_coco_triples(args.coco_dataset, source="--coco-dataset")
    return load_lazy_config(args.config_file, args.opts)


def with_yaml_seed(cfg, seed: int):
    """The yaml config with SEED ``seed``."""
    cfg = cfg.clone()
    cfg.defrost()
    cfg.SEED = seed
    cfg.freeze()
    return cfg


def with_lazy_seed(cfg: DictConfig, seed: int) -> DictConfig:
    """The recipe with train.seed ``seed``."""
    cfg.train.seed = seed
    return cfg


def scale_yaml_to_world_size(cfg, world_size: int):
    """detectron2's ``auto_scale_workers`` (SOLVER.REFERENCE_WORLD_SIZE), its assertion as a
    UserError."""
    reference, batch = cfg.SOLVER.REFERENCE_WORLD_SIZE, cfg.SOLVER.IMS_PER_BATCH
    if reference and batch % reference:
        raise UserError(
            f"SOLVER.IMS_PER_BATCH {batch} does not split over "
            f"SOLVER.REFERENCE_WORLD_SIZE {reference}: use a multiple of it"
        )
    return Trainer.auto_scale_workers(cfg, world_size)


YAML_CONFIGS = ConfigSystem(
    description="Train or evaluate a yaml config (configs/).",
    output_dir_key="OUTPUT_DIR",
    datasets_help="DATASETS.TRAIN / TEST (the run's config keeps it in DATASETS.COCO_INSTANCES)",
    resolve=resolve_yaml_config,
    load=load_run_config,
    settings=yaml_run_settings,
    scale=scale_yaml_to_world_size,
    build_model=build_yaml_model,
    with_seed=with_yaml_seed,
    run=run,
)

LAZY_CONFIGS = ConfigSystem(
    description="Train or evaluate a LazyConfig recipe (configs/LazyConfigs/).",
    output_dir_key="train.output_dir",
    datasets_help="dataloader.train.dataset.names / dataloader.test.dataset.names",
    resolve=resolve_lazy_recipe,
    load=load_lazy_run_config,
    settings=lazy_run_settings,
    scale=lambda cfg, world_size: scale_to_world_size(copy.deepcopy(cfg), world_size),
    build_model=lambda cfg, device: instantiate(cfg.model).to(device),
    with_seed=with_lazy_seed,
    run=run_lazy,
    tool="tools/lazyconfig_train_net.py",
)


def training_command_line(
    argv: Optional[Sequence[str]] = None, system: ConfigSystem = YAML_CONFIGS
) -> argparse.Namespace:
    """The command line of a training tool, as every process of the run reads it (nothing
    changes it afterwards), its launch options checked (:func:`check_launch_arguments`):
    ``config_file``, the path of the file or NAME given (``system.resolve``: the file
    default_setup logs; an unknown NAME is a user error, one line), and ``command``, how the
    tool was started and ``argv`` (:func:`interrupted_line`)."""
    parser = argument_parser(system.output_dir_key, system.datasets_help)
    parser.description = system.description
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_command_line(parser, argv)
    print("Command Line Args:", args)
    with reporting_user_errors(args.debug):
        check_launch_arguments(args)
        config_file = system.resolve(args.config_file)
    return argparse.Namespace(
        **{**vars(args), "config_file": config_file, "command": (invoked_as(system.tool), argv)}
    )


def main(argv: Optional[Sequence[str]] = None, system: ConfigSystem = YAML_CONFIGS) -> int:
    """tools/train_net.py (``system`` :data:`YAML_CONFIGS`) and tools/lazyconfig_train_net.py
    (:data:`LAZY_CONFIGS`), as detectron2's tools/train_net.py: parse the command line, check
    everything before launch, launch :func:`run` (:func:`run_lazy`); returns the exit status."""
    args = training_command_line(argv, system)
    started = []  # the run's folder, once the checks passed (for the line an interrupt prints)
    with reporting_interrupts(lambda interrupt: interrupted_line(interrupt, args, started)):
        with checked_run(args, system, started) as checked:
            return launch_run(system.run, args, checked)


class CheckedRun(NamedTuple):
    """What :func:`checked_run` yields."""

    cfg: Any  # the config, its seed drawn where the seed is negative
    settings: RunSettings
    evaluation: Optional[Evaluation]  # the --eval-only plan; None for training


@contextlib.contextmanager
def checked_run(
    args: argparse.Namespace, system: ConfigSystem, started: List[str]
) -> Iterator[CheckedRun]:
    """Every check before launch, in one call: the config's, before the output folder is
    touched (:func:`check_config_before_launch`, :func:`check_run_not_finished`), then, holding
    the folder's lock (on machine 0, whose main process writes it; taking it checks that the
    folder can be written), the folder's, the data's and the weights'
    (:func:`check_before_launch`). Holds the lock while the block runs; ``started`` gets the
    folder once the checks passed: it is then the run's. A check's error is one line (exit
    status 2)."""
    lock = None
    with reporting_user_errors(args.debug):
        cfg = system.load(args)
        run = system.settings(cfg)
        model = check_config_before_launch(args, system, cfg, run)
        check_run_not_finished(args, system, cfg, run)
        seed = run.training.seed
        if seed.value < 0 and runs_in_this_process(args):  # config.yaml records the seed
            drawn = int.from_bytes(os.urandom(4), "big") >> 1  # < 2**31, for numpy's seed
            print(f"{seed.key} {seed.value}: this run's seed is {drawn} (config.yaml says so)")
            cfg = system.with_seed(cfg, drawn)
        if args.machine_rank == 0:
            lock = OutputDirLock(run.output_dir.value, key=run.output_dir.key).acquire()
    try:
        with reporting_user_errors(args.debug):
            evaluation = check_before_launch(args, run, model)
        started.append(run.output_dir.value)
        yield CheckedRun(cfg, run, evaluation)
    finally:
        if lock is not None:
            lock.release()


def launch_run(run_function, args: argparse.Namespace, checked: CheckedRun) -> int:
    """``run_function(args, evaluation, cfg)`` in every process, by detectron2's launch (on the
    CPU, ``--num-gpus N`` starts N gloo processes: detectron2's launch needs CUDA); the config
    goes to a run in this process (one process in all), started processes load their own.
    Returns the exit status: 2 when a worker reported a user error, 130 / 143 when SIGINT /
    SIGTERM stopped the workers."""
    in_this_process = runs_in_this_process(args)
    try:
        launch(
            run_function,
            args.num_gpus,
            num_machines=args.num_machines,
            machine_rank=args.machine_rank,
            dist_url=args.dist_url,
            cpu=torch.device(checked.settings.device.value).type == "cpu",
            args=(args, checked.evaluation, checked.cfg if in_this_process else None),
        )
    except ProcessExitedException as error:  # a worker reported a user error or an interrupt
        if error.exit_code not in (USAGE_ERROR_STATUS, *INTERRUPTED_STATUSES):
            raise
        return error.exit_code
    return 0


if __name__ == "__main__":  # python -m lambda_det.cli.train_net: the demo's and comparisons' runs
    sys.exit(main())
