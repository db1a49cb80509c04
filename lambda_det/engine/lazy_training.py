"""The training loop of LazyConfig recipes (tools/lazyconfig_train_net.py), in the shape of
detectron2's tools/lazyconfig_train_net.py ``do_train`` / ``do_test``, on the pieces the yaml
trainer uses (:func:`~lambda_det.engine.trainer.build_step_trainer`, safe and atomic
checkpoints, :class:`~lambda_det.engine.trainer.FinalEvalHook`, the deterministic loader, the
same checks and the same train.output_dir/eval_results.json)."""

import logging
from typing import Optional

import torch
from detectron2.config import instantiate
from detectron2.engine import hooks
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from omegaconf import DictConfig, OmegaConf

from lambda_det.checkpoint.checkpointer import AtomicCheckpointer
from lambda_det.compat import ddp_without_buffer_sync
from lambda_det.engine.deterministic import DeterministicTrainLoader, SeedEachIteration
from lambda_det.engine.interrupt import InterruptCheckpoint
from lambda_det.engine.preflight import check_training_settings
from lambda_det.engine.run_logging import resume_metrics, run_writers
from lambda_det.engine.run_settings import lazy_data_settings, lazy_training_settings
from lambda_det.engine.trainer import FinalEvalHook, build_step_trainer, write_eval_results
from lambda_det.utils.atomic import DISK_ERRNOS, reporting_write_errors
from lambda_det.utils.run_defaults import AMP_DTYPE

__all__ = ["build_model", "train", "evaluate"]

logger = logging.getLogger(__name__)


def evaluate(cfg: DictConfig, model: torch.nn.Module):
    """COCO evaluation of ``model`` on ``dataloader.test`` with ``dataloader.evaluator``;
    the main process prints the results and writes train.output_dir/eval_results.json."""
    results = inference_on_dataset(
        model, instantiate(cfg.dataloader.test), instantiate(cfg.dataloader.evaluator)
    )
    if comm.is_main_process() and results:
        print_csv_format(results)
        config = _printable(OmegaConf.to_container(cfg, resolve=True))
        write_eval_results(cfg.train.output_dir, OmegaConf.to_yaml(config), results)
    return results


def _printable(node):
    """A config as plain data for the record in eval_results.json: callables by name, other
    objects (the model the trainer put into optimizer.params) by type."""
    if isinstance(node, dict):
        return {key: _printable(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_printable(value) for value in node]
    if node is None or isinstance(node, (str, int, float, bool)):
        return node
    if hasattr(node, "__qualname__"):
        return f"{node.__module__}.{node.__qualname__}"
    return f"<{type(node).__name__}>"


def _deterministic_seed(cfg: DictConfig) -> Optional[int]:
    """train.seed when train.deterministic is set (DATALOADER.DETERMINISTIC of the yaml
    configs: every iteration a function of (seed, iteration)), else None; checked by
    :func:`~lambda_det.engine.preflight.check_training_settings`."""
    return cfg.train.seed if cfg.train.get("deterministic", False) else None


def _deterministic_train_loader(cfg: DictConfig, seed: int) -> DeterministicTrainLoader:
    """dataloader.train's dataset and mapper, drawn by (seed, iteration) instead of detectron2's
    sampler (see :mod:`lambda_det.engine.deterministic`)."""
    loader = cfg.dataloader.train
    return DeterministicTrainLoader(
        instantiate(loader.dataset),
        instantiate(loader.mapper),
        loader.total_batch_size,
        seed,
        comm.get_rank(),
        comm.get_world_size(),
    )


def build_model(cfg: DictConfig) -> torch.nn.Module:
    """``cfg.model`` on train.device."""
    return instantiate(cfg.model).to(cfg.train.device)


def train(cfg: DictConfig, resume: bool) -> None:
    """Train ``cfg.model`` for train.max_iter iterations, checkpointing and evaluating as
    ``cfg.train`` says; with ``resume``, continue from train.output_dir's last checkpoint.
    With train.deterministic, every iteration is a function of (train.seed, iteration), so that
    a resumed run continues exactly. Under
    :func:`~lambda_det.engine.interrupt.stopping_on_signals`, SIGINT or SIGTERM saves the
    iteration in flight and stops, as the yaml trainer does."""
    check_training_settings(lazy_training_settings(cfg))  # as before launch, for API callers
    seed = _deterministic_seed(cfg)
    if seed is not None:
        seed_all_rng(seed)  # the same initial weights on every rank and every run
    model = build_model(cfg)
    logger.info("Model:\n%s", model)
    if cfg.train.get("compile_backbone", False):
        model.backbone.compile()  # in place: parameter names and checkpoints stay the same
    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)
    train_loader = (
        instantiate(cfg.dataloader.train)
        if seed is None
        else _deterministic_train_loader(cfg, seed)
    )
    ddp = dict(cfg.train.ddp)
    if ddp.get("broadcast_buffers") is False:  # detectron2's spelling, deprecated in torch
        del ddp["broadcast_buffers"]
        ddp.update(ddp_without_buffer_sync())
    amp = cfg.train.amp
    trainer = build_step_trainer(
        model,
        train_loader,
        optimizer,
        cfg.train.device,
        amp.get("dtype", AMP_DTYPE) if amp.enabled else None,
        **ddp,
    )
    checkpointer = AtomicCheckpointer(trainer.model, cfg.train.output_dir, trainer=trainer)
    main = comm.is_main_process()
    trainer.register_hooks(
        [
            SeedEachIteration(seed) if seed is not None else None,
            hooks.IterationTimer(),
            hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier)),
            hooks.PeriodicCheckpointer(checkpointer, **cfg.train.checkpointer) if main else None,
            FinalEvalHook(cfg.train.eval_period, lambda: evaluate(cfg, trainer.model))
            if lazy_data_settings(cfg).test.value  # no test set: nothing to evaluate
            else None,
            hooks.PeriodicWriter(
                run_writers(cfg.train.output_dir, cfg.train.max_iter), period=cfg.train.log_period
            )
            if main
            else None,
            InterruptCheckpoint(),  # last: after the step's checkpoint and writes
        ]
    )
    resuming = resume and checkpointer.has_checkpoint()
    # A resumed checkpoint must fit the whole model; initial weights, the image network.
    checkpointer.require = "all" if resuming else "backbone"
    checkpointer.resume_or_load(cfg.train.init_checkpoint, resume=resume)
    start = trainer.iter + 1 if resuming else 0
    if resuming and main and start < cfg.train.max_iter:  # only iterations trained again
        resume_metrics(trainer, start - 1)
    if seed is not None:
        train_loader.start_iteration = start
    with reporting_write_errors(cfg.train.output_dir, "train.output_dir", errnos=DISK_ERRNOS):
        trainer.train(start, cfg.train.max_iter)
