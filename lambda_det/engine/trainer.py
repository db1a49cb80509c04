"""Training and evaluation on top of detectron2's ``DefaultTrainer`` (tools/train_net.py's yaml
configs), and what the LazyConfig training loop (:mod:`.lazy_training`) shares with it: the
step trainer (DDP, mixed precision) and the record of evaluation results."""

import argparse
import json
import logging
import os
import weakref
from collections import OrderedDict
from typing import Optional, Tuple

import torch
from detectron2.config import CfgNode
from detectron2.data import build_detection_test_loader, build_detection_train_loader
from detectron2.engine import (
    DefaultTrainer,
    SimpleTrainer,
    TrainerBase,
    create_ddp_model,
    default_setup,
)
from detectron2.engine.hooks import EvalHook, PeriodicWriter
from detectron2.evaluation import COCOEvaluator
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from detectron2.utils.logger import setup_logger

from lambda_det.checkpoint.checkpointer import AtomicCheckpointer
from lambda_det.compat import ddp_without_buffer_sync, without_cuda_home_warning
from lambda_det.compat.internals import (
    eval_hook_arguments,
    inner_trainer,
    periodic_writer_writers,
    plain_config_printouts,
    release_eval_function,
    set_inner_trainer,
)
from lambda_det.data import build_mapper, register_datasets
from lambda_det.data.checks import load_training_dicts, yaml_data_settings
from lambda_det.engine.amp import MixedPrecisionTrainer, warn_about_slow_cpu_amp
from lambda_det.engine.deterministic import DeterministicTrainLoader, SeedEachIteration
from lambda_det.engine.interrupt import InterruptCheckpoint
from lambda_det.engine.preflight import (
    check_batch_size,
    check_training_settings,
)
from lambda_det.engine.run_logging import (
    ExpectedTime,
    resume_metrics,
    run_writers,
    setup_run_logging,
)
from lambda_det.engine.run_settings import yaml_training_settings
from lambda_det.utils.atomic import OutputWriteError, atomic_path

__all__ = [
    "Trainer",
    "setup_cfg",
    "plain_default_setup",
    "build_step_trainer",
    "build_ddp_model",
    "build_single_step_trainer",
    "write_eval_results",
    "FinalEvalHook",
]

logger = logging.getLogger(__name__)


def setup_cfg(
    cfg: CfgNode,
    args: argparse.Namespace,
    evaluation: Optional[Tuple[str, str]] = None,
) -> CfgNode:
    """The run's frozen config: ``cfg`` (as :func:`lambda_det.cli.checks.load_run_config`
    loaded it from the command line ``args``, whose ``config_file`` is a path) with its datasets
    registered (:func:`lambda_det.data.register_datasets`), and detectron2's ``default_setup``
    (logging, seeds, the config file logged and the config dumped to OUTPUT_DIR).
    ``evaluation``: the (OUTPUT_DIR, MODEL.WEIGHTS) of an ``--eval-only`` run, as the launching
    process decided them (:func:`lambda_det.cli.train_net.plan_evaluation`)."""
    cfg = cfg.clone()
    cfg.defrost()
    register_datasets(cfg)
    if evaluation is not None:
        cfg.OUTPUT_DIR, cfg.MODEL.WEIGHTS = evaluation
    cfg.freeze()
    plain_default_setup(cfg, args)
    return cfg


def plain_default_setup(cfg, args: argparse.Namespace) -> None:
    """Detectron2's ``default_setup`` (yaml or LazyConfig) without terminal colours: it logs the
    config files through pygments, whose escape codes would land in log.txt and piped output.
    lambda_det's loggers log with detectron2's, and the console shows long printouts as a
    pointer to log.txt (:func:`~lambda_det.engine.run_logging.setup_run_logging`); autocast
    training on a CPU without kernels for its dtype gets a warning."""
    setup_run_logging(cfg)
    with plain_config_printouts(), without_cuda_home_warning():
        default_setup(cfg, args)
    _log_write_errors_without_traceback()
    if not getattr(args, "eval_only", False):
        warn_about_slow_cpu_amp(cfg)


class _WriteErrorWithoutTraceback(logging.Filter):
    """Detectron2 logs the exception that ends training with its traceback; for a file that
    cannot be written (:class:`OutputWriteError`) the message says it all, and the tools print
    it as their one error line (with its traceback under --debug)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], OutputWriteError):
            record.msg, record.args = f"{record.getMessage()} {record.exc_info[1]}", ()
            record.exc_info = record.exc_text = None
        return True


def _log_write_errors_without_traceback() -> None:
    train_loop = logging.getLogger("detectron2.engine.train_loop")
    if not any(isinstance(f, _WriteErrorWithoutTraceback) for f in train_loop.filters):
        train_loop.addFilter(_WriteErrorWithoutTraceback())


def write_eval_results(output_dir: str, config: str, results) -> None:
    """``output_dir/eval_results.json``: the run's config (as text) and its results, written
    atomically (a crash mid-write never leaves a truncated file)."""
    os.makedirs(output_dir, exist_ok=True)
    record = {"config": config, "results": _plain(results)}
    with (
        atomic_path(os.path.join(output_dir, "eval_results.json")) as temporary,
        open(temporary, "w") as f,
    ):
        json.dump(record, f, indent=2)


def _plain(results):
    """OrderedDicts and numpy floats to plain JSON types."""
    if isinstance(results, (dict, OrderedDict)):
        return {key: _plain(value) for key, value in results.items()}
    return float(results)


def build_step_trainer(
    model: torch.nn.Module,
    data_loader,
    optimizer,
    device: str,
    amp_dtype: Optional[str] = None,
    **ddp_options,
) -> TrainerBase:
    """The trainer of one iteration for both config systems: ``model`` in
    :func:`build_ddp_model`, then :func:`build_single_step_trainer`."""
    model = build_ddp_model(model, device, **ddp_options)
    return build_single_step_trainer(model, data_loader, optimizer, device, amp_dtype)


def build_ddp_model(model: torch.nn.Module, device: str, **ddp_options) -> torch.nn.Module:
    """``model`` in detectron2's ``create_ddp_model`` (unchanged in one process; on the CPU
    without GPU device ids, which detectron2 0.6 passes)."""
    if torch.device(device).type == "cpu":
        ddp_options.setdefault("device_ids", None)
    return create_ddp_model(model, **ddp_options)


def build_single_step_trainer(
    model: torch.nn.Module, data_loader, optimizer, device: str, amp_dtype: Optional[str] = None
) -> TrainerBase:
    """Detectron2's ``SimpleTrainer`` of ``model`` (DDP-wrapped already, or not), or
    :class:`MixedPrecisionTrainer` with ``amp_dtype``."""
    if amp_dtype is not None:
        return MixedPrecisionTrainer(
            model, data_loader, optimizer, dtype=amp_dtype, device_type=torch.device(device).type
        )
    return SimpleTrainer(model, data_loader, optimizer)


class FinalEvalHook(EvalHook):
    """Detectron2's ``EvalHook``, whose final evaluation runs only after every iteration
    completed: detectron2's also runs when the last iteration raised (e.g. its checkpoint could
    not be saved), and would write results of a model that no checkpoint holds."""

    def after_train(self):
        if self.trainer.iter >= self.trainer.max_iter:  # TrainerBase.train counts past the end
            super().after_train()  # evaluates: detectron2's condition holds too
        else:
            release_eval_function(self)  # as EvalHook.after_train: the closure holds the trainer


def cpu_training_sizes(cfg) -> Optional[str]:
    """The training and test sizes with their keys, for a run on the CPU (None elsewhere)."""
    if torch.device(cfg.MODEL.DEVICE).type != "cpu":
        return None
    settings = yaml_training_settings(cfg)
    sizes = [(settings.input_size, "training"), (settings.test_size, "evaluation")]
    said = [f"{size.value} px for {what} ({size.key})" for size, what in sizes if size is not None]
    return ", ".join(said) or None


class Trainer(DefaultTrainer):
    """Detectron2's ``DefaultTrainer`` with:

    * the LSJ mapper when ``INPUT.LSJ.ENABLED``;
    * COCO evaluation (boxes and masks, AP by object size) also written to
      ``OUTPUT_DIR/eval_results.json``; other metrics (PQ, mIoU) need a subclass that overrides
      ``build_evaluator``, as in detectron2's tools/train_net.py;
    * checkpoints read safely and written atomically (:class:`AtomicCheckpointer`), with the
      optimizer state (detectron2 0.6 leaves it out, so ``--resume`` restarted momentum from
      zero); MODEL.WEIGHTS must hold every weight of the image network (FPN and heads may
      be new), a resumed checkpoint every weight;
    * CPU data-parallel training over gloo (detectron2 0.6 passes GPU device ids to DDP);
    * mixed precision in float16 or bfloat16 (``SOLVER.AMP.DTYPE``), on GPUs and the CPU
      (:class:`~lambda_det.engine.amp.MixedPrecisionTrainer`); a compiled backbone with
      ``MODEL.LAMBDA_RESNET.COMPILE``;
    * ``DATALOADER.DETERMINISTIC``: every iteration a function of (SEED, iteration), so that
      ``--resume`` continues exactly (see :mod:`lambda_det.engine.deterministic`);
    * a checkpoint that cannot be saved stops training (``OutputWriteError``, naming the last
      complete checkpoint), and the final evaluation runs only after every iteration completed
      (:class:`FinalEvalHook`);
    * under :func:`~lambda_det.engine.interrupt.stopping_on_signals`, SIGINT or SIGTERM saves
      the iteration in flight and stops (:class:`~lambda_det.engine.interrupt.InterruptCheckpoint`);
    * a resumed run's metrics.json without the records after its checkpoint
      (:func:`~lambda_det.engine.run_logging.resume_metrics`).
    """

    def __init__(self, cfg: CfgNode):
        # DefaultTrainer.__init__ (below) builds the trainer with lambda_det's parts. Before it
        # builds the model: its logger and scaled config (scaling again changes nothing), for
        # the checks and the seed.
        if not logging.getLogger("detectron2").isEnabledFor(logging.INFO):
            setup_logger()
        cfg = DefaultTrainer.auto_scale_workers(cfg, comm.get_world_size())
        # As tools/train_net.py checks before launch, for the trainer built another way; on
        # every rank (only the main one has the writer that LOG_PERIOD drives).
        settings = yaml_training_settings(cfg)
        check_training_settings(settings)
        check_batch_size(cfg.SOLVER.IMS_PER_BATCH, comm.get_world_size())
        if cfg.DATALOADER.get("DETERMINISTIC", False):
            seed_all_rng(cfg.SEED)  # the same initial weights on every rank and every run
        device = cfg.MODEL.DEVICE
        amp_dtype = cfg.SOLVER.AMP.DTYPE if cfg.SOLVER.AMP.ENABLED else None
        # DefaultTrainer.__init__'s construction, in its order (model, optimizer, data loader,
        # DDP, step trainer, scheduler, checkpointer, hooks: the same random draws), with
        # lambda_det's parts; DefaultTrainer's methods (train, run_step, state_dict) do the rest.
        TrainerBase.__init__(self)
        model = self.build_model(cfg)
        optimizer = self.build_optimizer(cfg, model)
        data_loader = self.build_train_loader(cfg)
        # detectron2 asks for broadcast_buffers=False: in the keyword of this torch
        model = build_ddp_model(model, device, **ddp_without_buffer_sync())
        step_trainer = build_single_step_trainer(model, data_loader, optimizer, device, amp_dtype)
        set_inner_trainer(self, step_trainer)
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
            # its writers (build_writers'), at LOG_PERIOD: new ones would open a second
            # TensorBoard event file
            writers = periodic_writer_writers(hooks[-1])
            hooks[-1] = PeriodicWriter(writers, period=self.cfg.SOLVER.LOG_PERIOD)
        hooks = [
            FinalEvalHook(*eval_hook_arguments(hook)) if type(hook) is EvalHook else hook
            for hook in hooks
        ]
        if comm.is_main_process():
            hooks.append(ExpectedTime(sizes=cpu_training_sizes(self.cfg)))
        return hooks + [InterruptCheckpoint()]  # last: after the step's checkpoint and writes

    def build_writers(self):
        return run_writers(self.cfg.OUTPUT_DIR, self.max_iter)

    def state_dict(self):
        # detectron2 0.6's DefaultTrainer saves only the iteration and hook states: the
        # optimizer's momentum buffers were lost on --resume. Save the inner trainer too.
        state = super().state_dict()
        state["_trainer"] = inner_trainer(self).state_dict()
        return state

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if "_trainer" in state_dict:  # checkpoints of plain detectron2 0.6 runs have none
            inner_trainer(self).load_state_dict(state_dict["_trainer"])

    def resume_or_load(self, resume: bool = True):
        resuming = resume and self.checkpointer.has_checkpoint()
        self.checkpointer.require = "all" if resuming else "backbone"
        super().resume_or_load(resume=resume)
        # metrics.json loses only the records of iterations this run trains again.
        if resuming and comm.is_main_process() and self.start_iter < self.max_iter:
            resume_metrics(self, self.start_iter - 1)
        if isinstance(self.data_loader, DeterministicTrainLoader):
            self.data_loader.start_iteration = self.start_iter

    @classmethod
    def build_model(cls, cfg):
        """Detectron2's model; with ``MODEL.LAMBDA_RESNET.COMPILE`` its backbone compiled by
        ``torch.compile`` (in place: parameter names and checkpoints stay the same).

        Decision: ``dynamic=False``, one graph per input size. Training's LSJ crops have one
        size; at a second size (evaluation) torch's automatic dynamic shapes did not finish
        compiling the lambda layers in 15 minutes on 2 CPU cores, while a static recompile
        took about 3 minutes."""
        model = super().build_model(cfg)
        if cfg.MODEL.LAMBDA_RESNET.get("COMPILE", False):
            model.backbone.compile(dynamic=False)
        return model

    @classmethod
    def build_train_loader(cls, cfg):
        mapper = build_mapper(cfg, is_train=True)
        dataset = load_training_dicts(yaml_data_settings(cfg))
        if not cfg.DATALOADER.get("DETERMINISTIC", False):
            return build_detection_train_loader(cfg, mapper=mapper, dataset=dataset)
        return DeterministicTrainLoader(
            dataset,
            mapper,
            cfg.SOLVER.IMS_PER_BATCH,
            cfg.SEED,
            comm.get_rank(),
            comm.get_world_size(),
        )

    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        return build_detection_test_loader(
            cfg, dataset_name, mapper=build_mapper(cfg, is_train=False)
        )

    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder: Optional[str] = None):
        output_folder = output_folder or os.path.join(cfg.OUTPUT_DIR, "inference", dataset_name)
        return COCOEvaluator(dataset_name, output_dir=output_folder)

    @classmethod
    def test(cls, cfg, model, evaluators=None):
        results = super().test(cfg, model, evaluators)
        if comm.is_main_process() and results:
            write_eval_results(cfg.OUTPUT_DIR, cfg.dump(), results)
        return results
